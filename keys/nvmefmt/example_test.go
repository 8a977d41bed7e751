package nvmefmt_test

import (
	"encoding/hex"
	"errors"
	"fmt"

	"github.com/nvmegate/nvmegate/keys/nvmefmt"
)

// The examples use the public test key of libnvme's test/psk.c; never print
// a real secret.

func ExampleEncodeDHCHAP() {
	secret, _ := hex.DecodeString("5512DBB6737D0106F65975B773DFB011FFC344BCF442E2DD6D8BC4870B5D5B03")
	s, err := nvmefmt.EncodeDHCHAP(nvmefmt.HashNone, secret)
	if err != nil {
		panic(err)
	}
	fmt.Println(s)
	// Output: DHHC-1:00:VRLbtnN9AQb2WXW3c9+wEf/DRLz0QuLdbYvEhwtdWwNf9LrZ:
}

func ExampleParseDHCHAP() {
	k, err := nvmefmt.ParseDHCHAP("DHHC-1:01:90WR+faTu56Irm7wBhqqFpgGtTS9wPq4KziON4skLgpjUHdc:")
	if err != nil {
		panic(err)
	}
	fmt.Println(k.Hash, k.Hash.HMACName(), len(k.Secret))
	fmt.Println(k) // redacted

	_, err = nvmefmt.ParseDHCHAP("DHHC-1:01:90WR+faTu56Irm7wBhqqFpgGtTS9wPq4KziON4skLgpjUHdd:")
	fmt.Println(errors.Is(err, nvmefmt.ErrCRC), err)
	// Output:
	// sha256 hmac(sha256) 32
	// nvmefmt.DHCHAPKey{Hash: sha256, 32-byte secret redacted}
	// true nvmefmt: CRC-32 mismatch: DHHC-1 key checksum does not match its secret
}

func ExampleDeriveTLS() {
	key, err := nvmefmt.ParseTLSPSK("NVMeTLSkey-1:01:VRLbtnN9AQb2WXW3c9+wEf/DRLz0QuLdbYvEhwtdWwNf9LrZ:")
	if err != nil {
		panic(err)
	}
	creds, err := nvmefmt.DeriveTLS(key, "nqn.psk-test-host", "nqn.psk-test-subsys")
	if err != nil {
		panic(err)
	}
	fmt.Println(creds.IdentityV0)
	fmt.Println(creds.IdentityV1)
	fmt.Println(len(creds.PSKV1), "bytes for the .nvme keyring under IdentityV1")
	// Output:
	// NVMe0R01 nqn.psk-test-host nqn.psk-test-subsys
	// NVMe1R01 nqn.psk-test-host nqn.psk-test-subsys iSbjiStwJ/1TrTvDlt2fjFmzvsytOJelidNnA+X5lEU=
	// 32 bytes for the .nvme keyring under IdentityV1
}
