package nvmet

import (
	"reflect"
	"strings"
	"testing"

	"github.com/nvmegate/nvmegate/fabric"
)

// Every field of a state but its generation changes its digest: a field
// added to fabric's types and not to stateSum would let a changed state be
// skipped as unchanged.
func TestStateSumCoversEveryField(t *testing.T) {
	base := func() fabric.State {
		return fabric.State{Generation: 1, Subsystems: []fabric.Subsystem{{
			NQN:        "nqn.2026-01.test:s",
			Hosts:      []fabric.Host{{NQN: "h", DHCHAPKey: "k", DHCHAPCtrlKey: "c", DHCHAPHash: "hmac(sha256)", DHCHAPGroup: "ffdhe2048", TLSPSK: "p"}},
			Ports:      []fabric.Port{{ID: 1, Trtype: "tcp", Adrfam: "ipv4", Traddr: "a", Trsvcid: "4420", Treq: "r", Tsas: "none"}},
			Namespaces: []fabric.Namespace{{NSID: 1, MaxIOPS: 2, MaxMBps: 3, BackingDevice: "/dev/d", DataKey: []byte{1, 2, 3}}},
		}}}
	}
	want, _ := stateSum(base())
	// The leaf fields of each element type, changed one at a time.
	checked := 0
	var visit func(v reflect.Value, path string)
	visit = func(v reflect.Value, path string) {
		switch v.Kind() {
		case reflect.Struct:
			for i := range v.NumField() {
				visit(v.Field(i), path+"."+v.Type().Field(i).Name)
			}
		case reflect.Slice:
			if v.Type().Elem().Kind() == reflect.Uint8 { // a key: one leaf
				st := base()
				f := leaf(reflect.ValueOf(&st).Elem(), path)
				f.SetBytes(append(append([]byte(nil), f.Bytes()...), 'x'))
				check(t, st, want, path)
				checked++
				return
			}
			for i := range v.Len() {
				visit(v.Index(i), path)
			}
		case reflect.String:
			st := base()
			leaf(reflect.ValueOf(&st).Elem(), path).SetString(v.String() + "x")
			check(t, st, want, path)
			checked++
		case reflect.Uint16, reflect.Uint32, reflect.Uint64:
			st := base()
			f := leaf(reflect.ValueOf(&st).Elem(), path)
			f.SetUint(f.Uint() + 1)
			if path == ".Generation" {
				if got, _ := stateSum(st); got != want {
					t.Error("the generation changes the digest")
				}
				return
			}
			check(t, st, want, path)
			checked++
		default:
			t.Fatalf("%s: a %s field stateSum does not know", path, v.Kind())
		}
	}
	visit(reflect.ValueOf(base()), "")
	if checked != 21 { // a subsystem's NQN, 6 host, 7 port and 7 namespace fields
		t.Fatalf("%d fields checked, want 21", checked)
	}
}

// leaf follows a path of field names (slices: their first element).
func leaf(v reflect.Value, path string) reflect.Value {
	for _, name := range splitPath(path) {
		if v.Kind() == reflect.Slice {
			v = v.Index(0)
		}
		v = v.FieldByName(name)
	}
	return v
}

func splitPath(p string) []string { return strings.Split(strings.TrimPrefix(p, "."), ".") }

func check(t *testing.T, st fabric.State, want [32]byte, path string) {
	t.Helper()
	if got, _ := stateSum(st); got == want {
		t.Errorf("changing %s does not change the state's digest", path)
	}
}
