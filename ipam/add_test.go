package ipam

import (
	"errors"
	"reflect"
	"testing"
)

// TestAddSumsEveryField: each Add that combines the results of several
// Managers (the families of one pool) sums every numeric field and joins
// every list, so that a field added later cannot be left out of the sum.
func TestAddSumsEveryField(t *testing.T) {
	tests := map[string]struct {
		one any
		add func(a any) any
	}{
		"Counts":         {one: Counts{}, add: func(a any) any { return a.(Counts).Add(a.(Counts)) }},
		"Stats":          {one: Stats{}, add: func(a any) any { return a.(Stats).Add(a.(Stats)) }},
		"RecoveryReport": {one: RecoveryReport{}, add: func(a any) any { return a.(RecoveryReport).Add(a.(RecoveryReport)) }},
		"TakeoverReport": {one: TakeoverReport{}, add: func(a any) any { return a.(TakeoverReport).Add(a.(TakeoverReport)) }},
		"ResyncReport":   {one: ResyncReport{}, add: func(a any) any { return a.(ResyncReport).Add(a.(ResyncReport)) }},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			v := reflect.New(reflect.TypeOf(tc.one)).Elem()
			for i := range v.NumField() {
				f := v.Field(i)
				switch f.Kind() {
				case reflect.Int:
					f.SetInt(1)
				case reflect.Uint64:
					f.SetUint(1)
				case reflect.Slice:
					elem := reflect.New(f.Type().Elem()).Elem()
					if f.Type().Elem() == reflect.TypeFor[error]() {
						elem = reflect.ValueOf(errors.New("conflict"))
					}
					f.Set(reflect.Append(f, elem))
				default:
					t.Fatalf("field %s of kind %s: teach this test to fill it", v.Type().Field(i).Name, f.Kind())
				}
			}
			sum := reflect.ValueOf(tc.add(v.Interface()))
			for i := range sum.NumField() {
				f, name := sum.Field(i), sum.Type().Field(i).Name
				switch f.Kind() {
				case reflect.Int:
					if f.Int() != 2 {
						t.Errorf("%s.%s = %d after adding 1 and 1", sum.Type().Name(), name, f.Int())
					}
				case reflect.Uint64:
					if f.Uint() != 2 {
						t.Errorf("%s.%s = %d after adding 1 and 1", sum.Type().Name(), name, f.Uint())
					}
				case reflect.Slice:
					if f.Len() != 2 {
						t.Errorf("%s.%s has %d items after joining 1 and 1", sum.Type().Name(), name, f.Len())
					}
				}
			}
		})
	}
}

// TestCountsAddSaturates: the usable count of a pool with an IPv6 /64
// beside an IPv4 range stays at the largest uint64, as a Manager's does.
func TestCountsAddSaturates(t *testing.T) {
	c := Counts{Usable: ^uint64(0)}.Add(Counts{Usable: 254})
	if c.Usable != ^uint64(0) {
		t.Errorf("Usable %d, want saturated", c.Usable)
	}
}
