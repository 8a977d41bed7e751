package store

import (
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"time"

	"github.com/nvmegate/nvmegate"
)

// Records are stored as JSON through the structs below rather than the domain
// types themselves: the domain types carry no JSON tags and may rename fields
// freely, while the on-disk names are fixed here. Every record carries "v",
// the record version, so that a later schema can change one record type and
// still read the old ones during a migration.
const recordVersion = 1

type targetRecord struct {
	V         int          `json:"v"`
	ID        string       `json:"id"`
	Fabric    string       `json:"fabric"`
	Region    string       `json:"region"`
	Rack      string       `json:"rack,omitempty"`
	Driver    string       `json:"driver"`
	Ports     []portRecord `json:"ports"`
	CreatedAt time.Time    `json:"created_at"`
}

type portRecord struct {
	ID            uint16 `json:"id"`
	Transport     string `json:"transport"`
	AddressFamily string `json:"address_family"`
	Address       string `json:"address"`
	ServiceID     string `json:"service_id"`
	SecureChannel string `json:"secure_channel,omitempty"`
	Subnet        string `json:"subnet,omitempty"`
}

type subsystemRecord struct {
	V           int       `json:"v"`
	NQN         string    `json:"nqn"`
	TargetID    string    `json:"target_id"`
	Tenant      string    `json:"tenant"`
	PortIDs     []uint16  `json:"port_ids"`
	DHCHAP      bool      `json:"dhchap"`
	TLS         bool      `json:"tls"`
	Description string    `json:"description,omitempty"`
	CreatedAt   time.Time `json:"created_at"`
}

type namespaceRecord struct {
	V             int       `json:"v"`
	SubsystemNQN  string    `json:"subsystem_nqn"`
	NSID          uint32    `json:"nsid"`
	Tenant        string    `json:"tenant"`
	Region        string    `json:"region"`
	DataClass     string    `json:"data_class"`
	DatasetName   string    `json:"dataset_name"`
	DatasetDigest string    `json:"dataset_digest"`
	QoSMaxIOPS    uint64    `json:"qos_max_iops,omitempty"`
	QoSMaxMBps    uint64    `json:"qos_max_mbps,omitempty"`
	BackingDevice string    `json:"backing_device,omitempty"`
	CreatedAt     time.Time `json:"created_at"`
	Incarnation   string    `json:"incarnation,omitempty"`
}

type hostBindingRecord struct {
	V         int       `json:"v"`
	SPIFFEID  string    `json:"spiffe_id"`
	HostNQN   string    `json:"host_nqn"`
	Tenant    string    `json:"tenant,omitempty"`
	Subnets   []string  `json:"subnets,omitempty"`
	CreatedAt time.Time `json:"created_at"`
}

func encodeTarget(t *nvmegate.Target) ([]byte, error) {
	r := targetRecord{
		V: recordVersion, ID: t.ID, Fabric: t.Fabric, Region: t.Region, Rack: t.Rack,
		Driver: t.Driver, CreatedAt: t.CreatedAt,
		Ports: make([]portRecord, len(t.Ports)),
	}
	for i, p := range t.Ports {
		r.Ports[i] = portRecord(p)
	}
	return encode("target", &r)
}

func decodeTarget(v []byte) (*nvmegate.Target, error) {
	var r targetRecord
	if err := decode("target", v, &r, &r.V); err != nil {
		return nil, err
	}
	t := &nvmegate.Target{
		ID: r.ID, Fabric: r.Fabric, Region: r.Region, Rack: r.Rack, Driver: r.Driver,
		CreatedAt: r.CreatedAt,
		Ports:     make([]nvmegate.Port, len(r.Ports)),
	}
	for i, p := range r.Ports {
		t.Ports[i] = nvmegate.Port(p)
	}
	return t, nil
}

func encodeSubsystem(s *nvmegate.Subsystem) ([]byte, error) {
	return encode("subsystem", &subsystemRecord{
		V: recordVersion, NQN: s.NQN, TargetID: s.TargetID, Tenant: s.Tenant,
		PortIDs: s.PortIDs, DHCHAP: s.DHCHAP, TLS: s.TLS, Description: s.Description,
		CreatedAt: s.CreatedAt,
	})
}

func decodeSubsystem(v []byte) (*nvmegate.Subsystem, error) {
	var r subsystemRecord
	if err := decode("subsystem", v, &r, &r.V); err != nil {
		return nil, err
	}
	return &nvmegate.Subsystem{
		NQN: r.NQN, TargetID: r.TargetID, Tenant: r.Tenant, PortIDs: r.PortIDs,
		DHCHAP: r.DHCHAP, TLS: r.TLS, Description: r.Description, CreatedAt: r.CreatedAt,
	}, nil
}

func encodeNamespace(n *nvmegate.Namespace) ([]byte, error) {
	return encode("namespace", &namespaceRecord{
		V: recordVersion, SubsystemNQN: n.SubsystemNQN, NSID: n.NSID, Tenant: n.Tenant,
		Region: n.Region, DataClass: n.DataClass,
		DatasetName: n.Dataset.Name, DatasetDigest: n.Dataset.Digest,
		QoSMaxIOPS: n.QoS.MaxIOPS, QoSMaxMBps: n.QoS.MaxMBps,
		BackingDevice: n.BackingDevice, CreatedAt: n.CreatedAt, Incarnation: n.Incarnation,
	})
}

func decodeNamespace(v []byte) (*nvmegate.Namespace, error) {
	var r namespaceRecord
	if err := decode("namespace", v, &r, &r.V); err != nil {
		return nil, err
	}
	return &nvmegate.Namespace{
		SubsystemNQN: r.SubsystemNQN, NSID: r.NSID, Tenant: r.Tenant,
		Region: r.Region, DataClass: r.DataClass,
		Dataset:       nvmegate.Dataset{Name: r.DatasetName, Digest: r.DatasetDigest},
		QoS:           nvmegate.QoS{MaxIOPS: r.QoSMaxIOPS, MaxMBps: r.QoSMaxMBps},
		BackingDevice: r.BackingDevice, CreatedAt: r.CreatedAt, Incarnation: r.Incarnation,
	}, nil
}

func encodeHostBinding(h *nvmegate.HostBinding) ([]byte, error) {
	return encode("host binding", &hostBindingRecord{
		V: recordVersion, SPIFFEID: h.SPIFFEID, HostNQN: h.HostNQN, Tenant: h.Tenant,
		Subnets: h.Subnets, CreatedAt: h.CreatedAt,
	})
}

func decodeHostBinding(v []byte) (*nvmegate.HostBinding, error) {
	var r hostBindingRecord
	if err := decode("host binding", v, &r, &r.V); err != nil {
		return nil, err
	}
	return &nvmegate.HostBinding{
		SPIFFEID: r.SPIFFEID, HostNQN: r.HostNQN, Tenant: r.Tenant, Subnets: r.Subnets, CreatedAt: r.CreatedAt,
	}, nil
}

func encode(what string, r any) ([]byte, error) {
	b, err := json.Marshal(r)
	if err != nil {
		return nil, fmt.Errorf("store: encode %s: %w", what, err)
	}
	return b, nil
}

// decode unmarshals v into r and checks the record version *version read
// from it. A failure here means a corrupt or foreign file: it is an internal
// error, never a caller's.
func decode(what string, v []byte, r any, version *int) error {
	if err := json.Unmarshal(v, r); err != nil {
		return fmt.Errorf("store: decode %s: %w", what, err)
	}
	if *version != recordVersion {
		return fmt.Errorf("store: decode %s: record version %d, want %d", what, *version, recordVersion)
	}
	return nil
}

// Keys. Targets, subsystems and host bindings are keyed by their ID, NQN or
// SPIFFE ID as bytes. A namespace is keyed by its subsystem NQN, a 0x00
// separator and the NSID as 4 big-endian bytes: NQNs hold no control
// characters, so all namespaces of one subsystem are one contiguous key range
// (prefix NQN+0x00) in NSID order, and subsystems follow one another in NQN
// order. The subsystems_by_target index uses the same shape: target ID, 0x00,
// subsystem NQN.
const keySep = 0x00

func namespaceKey(nqn string, nsid uint32) []byte {
	k := make([]byte, 0, len(nqn)+5)
	k = append(k, nqn...)
	k = append(k, keySep)
	return binary.BigEndian.AppendUint32(k, nsid)
}

// namespacePrefix is the key prefix of all namespaces of subsystem nqn.
func namespacePrefix(nqn string) []byte {
	return append([]byte(nqn), keySep)
}

// namespaceRangeEnd is the smallest key after every namespace key of
// subsystem nqn: NQN, 0x01.
func namespaceRangeEnd(nqn string) []byte {
	return append([]byte(nqn), keySep+1)
}

// splitNamespaceKey is namespaceKey's inverse; ok is false for a key of
// another shape.
func splitNamespaceKey(k []byte) (nqn string, nsid uint32, ok bool) {
	n := len(k) - 5
	if n < 1 || k[n] != keySep {
		return "", 0, false
	}
	return string(k[:n]), binary.BigEndian.Uint32(k[n+1:]), true
}

// indexKey is the key of an index entry: the indexed value, 0x00, the
// primary key. indexPrefix is the range of one indexed value.
func indexKey(value, primary string) []byte {
	k := make([]byte, 0, len(value)+1+len(primary))
	k = append(k, value...)
	k = append(k, keySep)
	return append(k, primary...)
}

func indexPrefix(value string) []byte {
	return append([]byte(value), keySep)
}

// EncodeWrites appends the encoding of ws to b: what a change's payload is
// in the journal and in etcd. Each write is a flag byte (1: delete), the
// bucket name's length (one byte) and name, and the key and the value,
// each as a uvarint length and its bytes.
func EncodeWrites(b []byte, ws []Write) []byte {
	for _, w := range ws {
		flag := byte(0)
		if w.Delete {
			flag = 1
		}
		b = append(b, flag, byte(len(w.Bucket)))
		b = append(b, w.Bucket...)
		b = binary.AppendUvarint(b, uint64(len(w.Key)))
		b = append(b, w.Key...)
		b = binary.AppendUvarint(b, uint64(len(w.Value)))
		b = append(b, w.Value...)
	}
	return b
}

// DecodeWrites decodes EncodeWrites's encoding; the writes share b.
func DecodeWrites(b []byte) ([]Write, error) {
	var out []Write
	for len(b) > 0 {
		if len(b) < 2 || b[0] > 1 || len(b) < 2+int(b[1]) {
			return nil, errors.New("truncated write")
		}
		w := Write{Delete: b[0] == 1, Bucket: b[2 : 2+int(b[1])]}
		b = b[2+int(b[1]):]
		for _, f := range []*[]byte{&w.Key, &w.Value} {
			n, k := binary.Uvarint(b)
			if k <= 0 || n > uint64(len(b)-k) {
				return nil, errors.New("truncated write")
			}
			if k != len(binary.AppendUvarint(nil, n)) {
				return nil, errors.New("a length not in its shortest form")
			}
			*f, b = b[k:k+int(n)], b[k+int(n):]
		}
		out = append(out, w)
	}
	return out, nil
}
