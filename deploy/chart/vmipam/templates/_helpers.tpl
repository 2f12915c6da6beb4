{{/*
The labels of every object: kustomize's (app.kubernetes.io/part-of) and
Helm's. The selectors use only name and component, as the kustomize
manifests do, so that an upgrade never changes an immutable selector.
*/}}
{{- define "vmipam.labels" -}}
app.kubernetes.io/part-of: vmipam
app.kubernetes.io/managed-by: {{ .Release.Service }}
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" }}
{{- end }}

{{- define "vmipam.selectorLabels" -}}
app.kubernetes.io/name: vmipam
app.kubernetes.io/component: manager
{{- end }}

{{- define "vmipam.image" -}}
{{ .Values.image.repository }}:{{ .Values.image.tag | default .Chart.AppVersion }}
{{- end }}

{{/* The namespaces vmipam's webhooks and policies leave out. */}}
{{- define "vmipam.excludedNamespaces" -}}
{{- $ns := list .Release.Namespace -}}
{{- range .Values.webhook.excludedNamespaces }}{{ if not (has . $ns) }}{{ $ns = append $ns . }}{{ end }}{{ end -}}
{{- toYaml $ns -}}
{{- end }}

{{/* The Secret vmipam serves its certificate from, when it reads files. */}}
{{- define "vmipam.certSecret" -}}
{{- if eq .Values.tls.method "cert-manager" -}}
{{ .Values.tls.certManager.secretName }}
{{- else if eq .Values.tls.method "provided" -}}
{{ required "tls.provided.secretName: name the Secret (type kubernetes.io/tls) holding tls.crt and tls.key" .Values.tls.provided.secretName }}
{{- end -}}
{{- end }}

{{/* The caBundle of the webhook configurations, with tls.method=provided. */}}
{{- define "vmipam.caBundle" -}}
{{- if eq .Values.tls.method "provided" -}}
{{ required "tls.provided.caBundle: give the PEM of the CA that signed the certificate in tls.provided.secretName" .Values.tls.provided.caBundle | b64enc }}
{{- end -}}
{{- end }}

{{/* Fails on values that cannot work together. */}}
{{- define "vmipam.validate" -}}
{{- if not (has .Values.tls.method (list "self" "cert-manager" "provided")) -}}
{{- fail (printf "tls.method=%q: use self, cert-manager or provided" .Values.tls.method) -}}
{{- end -}}
{{- if and (eq .Values.tls.method "provided") (not (and .Values.tls.provided.secretName .Values.tls.provided.caBundle)) -}}
{{- fail "tls.method=provided: name the Secret (type kubernetes.io/tls) holding tls.crt and tls.key in tls.provided.secretName, and give the PEM of the CA that signed it in tls.provided.caBundle" -}}
{{- end -}}
{{- if and .Values.kinds.config (not .Values.kinds.wiring) -}}
{{- fail "kinds.config is set but kinds.wiring is not: render the wiring with `vmipam manifests --kinds-config <file> --namespace <release namespace>` and pass it with --set-file kinds.wiring=<file>" -}}
{{- end -}}
{{- if and .Values.kinds.wiring (not .Values.kinds.config) -}}
{{- fail "kinds.wiring is set but kinds.config is not: pass the kinds configuration the wiring was rendered from with --set-file kinds.config=<file>" -}}
{{- end -}}
{{- if and .Values.crds.enabled (not .Values.crds.virtualMachine) -}}
{{- range ((include "vmipam.kindsConfig" . | fromYaml).kinds | default list) -}}
{{- if and (eq (.group | default "") "vmipam.io") (eq (.kind | default "") "VirtualMachine") -}}
{{- fail "crds.virtualMachine=false leaves out vmipam's VirtualMachine CRD, but the kinds configuration serves that kind (vmipam.io VirtualMachine, which it serves when kinds.config is empty): pass the kinds you serve with --set-file kinds.config=<file> and their wiring with --set-file kinds.wiring=<file>, or keep crds.virtualMachine=true" -}}
{{- end -}}
{{- end -}}
{{- end -}}
{{- if and .Values.webhook.clientAuth.enabled (not .Values.webhook.clientAuth.caBundle) -}}
{{- fail "webhook.clientAuth.enabled: give the PEM of the CA that signs the API server's client certificate in webhook.clientAuth.caBundle" -}}
{{- end -}}
{{- if not (has .Values.webhook.failurePolicy (list "Fail" "Ignore")) -}}
{{- fail (printf "webhook.failurePolicy=%q: use Fail or Ignore" .Values.webhook.failurePolicy) -}}
{{- end -}}
{{- if or (lt (int .Values.webhook.timeoutSeconds) 1) (gt (int .Values.webhook.timeoutSeconds) 30) -}}
{{- fail (printf "webhook.timeoutSeconds=%v: the API server takes 1 to 30" .Values.webhook.timeoutSeconds) -}}
{{- end -}}
{{- end }}

{{/* The kinds configuration: kinds.config, or vmipam's own kind. */}}
{{- define "vmipam.kindsConfig" -}}
{{- .Values.kinds.config | default (.Files.Get "files/kinds.yaml") -}}
{{- end }}

{{/*
vmipam.render prints the objects of a multi-document YAML file generated
outside the chart (by controller-gen or `vmipam manifests`, copied into
files/ by `make manifests`) as installed by this release: the chart's
labels, the release namespace for vmipam's namespaced objects, its
ServiceAccount and Service; the webhook settings of the values; the CA
injection of the certificate method. Argument: (list $ $content).
*/}}
{{- define "vmipam.render" -}}
{{- $ := index . 0 -}}
{{- $ns := $.Release.Namespace -}}
{{- $excluded := include "vmipam.excludedNamespaces" $ | fromYamlArray -}}
{{- /* The admission policies name vmipam's ServiceAccount in CEL, as `vmipam manifests --namespace` wrote it. */ -}}
{{- $content := regexReplaceAll "system:serviceaccount:[a-z0-9.-]+:vmipam\\b" (index . 1) (printf "system:serviceaccount:%s:vmipam" $ns) -}}
{{- range regexSplit "(?m)^---[ \t]*$" $content -1 }}
{{- $o := fromYaml . -}}
{{- if and $o (hasKey $o "kind") }}
{{- $md := $o.metadata -}}
{{- $labels := merge (dict) ($md.labels | default dict) (include "vmipam.labels" $ | fromYaml) -}}
{{- $_ := set $md "labels" $labels -}}
{{- if hasKey $md "namespace" }}{{ $_ := set $md "namespace" $ns }}{{ end -}}
{{- if eq $md.name "validating-webhook-configuration" }}{{ $_ := set $md "name" "vmipam-validating" }}{{ end -}}
{{- range ($o.subjects | default list) }}
{{- if and (eq .kind "ServiceAccount") (eq .name "vmipam") }}{{ $_ := set . "namespace" $ns }}{{ end -}}
{{- end }}
{{- if or (eq $o.kind "MutatingWebhookConfiguration") (eq $o.kind "ValidatingWebhookConfiguration") }}
{{- if eq $.Values.tls.method "cert-manager" }}
{{- $_ := set $md "annotations" (merge ($md.annotations | default dict) (dict "cert-manager.io/inject-ca-from" (printf "%s/vmipam-webhook" $ns))) -}}
{{- end }}
{{- range $o.webhooks }}
{{- $svc := .clientConfig.service -}}
{{- if and $svc $.Values.webhook.url }}
{{- $_ := set .clientConfig "url" (printf "%s%s" (trimSuffix "/" $.Values.webhook.url) ($svc.path | default "/")) -}}
{{- $_ := unset .clientConfig "service" -}}
{{- else if $svc }}
{{- $_ := set $svc "name" "vmipam-webhook" -}}
{{- $_ := set $svc "namespace" $ns -}}
{{- end }}
{{- if eq $.Values.tls.method "provided" }}{{ $_ := set .clientConfig "caBundle" (include "vmipam.caBundle" $) }}{{ end -}}
{{- if eq $o.kind "MutatingWebhookConfiguration" }}
{{- $_ := set . "failurePolicy" $.Values.webhook.failurePolicy -}}
{{- $_ := set . "timeoutSeconds" (int $.Values.webhook.timeoutSeconds) -}}
{{- end }}
{{- $_ := set . "namespaceSelector" (dict "matchExpressions" (list (dict "key" "kubernetes.io/metadata.name" "operator" "NotIn" "values" $excluded))) -}}
{{- end }}
{{- end }}
{{- /* A binding with no matchResources (the IPRelease policy) matches in every namespace: no webhook is called, so none is excluded. */}}
{{- if and (eq $o.kind "ValidatingAdmissionPolicyBinding") $o.spec.matchResources }}
{{- $_ := set $o.spec.matchResources "namespaceSelector" (dict "matchExpressions" (list (dict "key" "kubernetes.io/metadata.name" "operator" "NotIn" "values" $excluded))) -}}
{{- end }}
{{- if and (eq $o.kind "CustomResourceDefinition") $.Values.crds.keep }}
{{- $_ := set $md "annotations" (merge ($md.annotations | default dict) (dict "helm.sh/resource-policy" "keep")) -}}
{{- end }}
---
{{ toYaml $o }}
{{- end }}
{{- end }}
{{- end }}
