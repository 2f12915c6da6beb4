package pki_test

import (
	"crypto/x509"
	"fmt"
	"net"
	"time"

	"github.com/vmipam/vmipam/certs/pki"
)

func Example() {
	now := time.Date(2030, 1, 1, 0, 0, 0, 0, time.UTC)
	ca, err := pki.NewCA("vmipam-webhook-ca", now, pki.DefaultCAValidity)
	if err != nil {
		panic(err)
	}
	names := pki.Names{DNSNames: []string{"vmipam-webhook.vmipam-system.svc"}, IPAddresses: []net.IP{net.IPv4(127, 0, 0, 1)}}
	serving, err := pki.NewServingCert(ca, names, now, pki.DefaultCertValidity)
	if err != nil {
		panic(err)
	}
	// What a webhook configuration's caBundle would hold.
	bundle := pki.EncodeCertificates(ca.Cert)
	cas, _ := pki.ParseCertificates(bundle)
	issuer, err := pki.VerifyServing(serving.Cert, cas, names, now)
	fmt.Println(err == nil, issuer.Equal(ca.Cert))
	fmt.Println(pki.RenewalTime(serving.Cert, 0).Format(time.DateOnly))
	fmt.Println(pki.NeedsRotation(serving.Cert, now.Add(61*24*time.Hour), 0))

	_, err = pki.VerifyServing(serving.Cert, []*x509.Certificate{ca.Cert}, names, serving.Cert.NotAfter.Add(time.Second))
	fmt.Println(err != nil)
	// Output:
	// true true
	// 2030-03-01
	// true
	// true
}
