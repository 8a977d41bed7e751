package audit_test

import (
	"bufio"
	"context"
	"encoding/hex"
	"fmt"
	"math/rand/v2"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/nvmegate/nvmegate/attest"
	"github.com/nvmegate/nvmegate/audit"
)

const crashEnv = "NVMEGATE_AUDIT_CRASH_CHILD"

// crashChild is the child process of TestCrashRecovery: it appends from 16
// goroutines, with a checkpointer signing every 20 ms, and prints
// "ack <index> <leaf hash>" for every acknowledged (durable) append, one
// write(2) per line, until it is killed.
func crashChild(path string) {
	l, err := audit.Open(path, audit.Options{Origin: testOrigin, Signer: testSigner(nil, "crash-key", 1)})
	if err != nil {
		fmt.Fprintln(os.Stderr, "child open:", err)
		os.Exit(3)
	}
	go (&audit.Checkpointer{Log: l, Interval: 20 * time.Millisecond}).Run(context.Background())
	var mu sync.Mutex
	var wg sync.WaitGroup
	for w := 0; w < 16; w++ {
		wg.Add(1)
		go func(w int) {
			defer wg.Done()
			for i := 0; ; i++ {
				idx, leaf, err := l.Append(context.Background(), sampleEntry(w*1_000_000+i))
				if err != nil {
					fmt.Fprintln(os.Stderr, "child append:", err)
					os.Exit(4)
				}
				line := fmt.Sprintf("ack %d %x\n", idx, leaf)
				mu.Lock()
				os.Stdout.WriteString(line) // unbuffered: one write per ack
				mu.Unlock()
			}
		}(w)
	}
	wg.Wait()
}

func TestMain(m *testing.M) {
	if p := os.Getenv(crashEnv); p != "" {
		crashChild(p)
		return
	}
	os.Exit(m.Run())
}

// TestCrashRecovery kills a child appending under concurrent load with
// SIGKILL, many times, and checks after each restart that every
// acknowledged entry is present with its leaf hash, that the log opens,
// signs a checkpoint consistent with the previous one, and verifies.
func TestCrashRecovery(t *testing.T) {
	rounds := 20
	if testing.Short() {
		rounds = 4
	}
	path := t.TempDir() + "/audit.db"
	keys := []attest.PublicKey{testSigner(t, "crash-key", 1).PublicKey()}
	acked := map[uint64]string{}
	rng := rand.New(rand.NewPCG(1, 2))
	for round := 0; round < rounds; round++ {
		cmd := exec.Command(os.Args[0], "-test.run=^TestCrashRecovery$")
		cmd.Env = append(os.Environ(), crashEnv+"="+path)
		cmd.Stderr = os.Stderr
		out, err := cmd.StdoutPipe()
		if err != nil {
			t.Fatal(err)
		}
		if err := cmd.Start(); err != nil {
			t.Fatal(err)
		}
		got := make(chan int, 1)
		first := make(chan struct{})
		go func() {
			n := 0
			sc := bufio.NewScanner(out)
			for sc.Scan() {
				f := strings.Fields(sc.Text())
				if len(f) != 3 || f[0] != "ack" {
					continue
				}
				i, _ := strconv.ParseUint(f[1], 10, 64)
				acked[i] = f[2]
				if n++; n == 1 {
					close(first)
				}
			}
			got <- n
		}()
		// Kill at a random moment once the child is appending.
		select {
		case <-first:
		case <-time.After(10 * time.Second):
			t.Fatalf("round %d: the child acknowledged nothing in 10s", round)
		}
		time.Sleep(time.Duration(rng.IntN(150)) * time.Millisecond)
		if err := cmd.Process.Signal(syscall.SIGKILL); err != nil {
			t.Fatal(err)
		}
		n := <-got
		_ = cmd.Wait()

		// Every acknowledged entry survived.
		l, err := audit.Open(path, audit.Options{Origin: testOrigin, Signer: testSigner(t, "crash-key", 1)})
		if err != nil {
			t.Fatalf("round %d: reopen after SIGKILL: %v", round, err)
		}
		size := l.Size()
		for i, want := range acked {
			if i >= size {
				t.Fatalf("round %d: acknowledged entry %d lost (size %d)", round, i, size)
			}
			h, err := l.LeafHashAt(i)
			if err != nil || hex.EncodeToString(h[:]) != want {
				t.Fatalf("round %d: entry %d has leaf %x, acknowledged %s (%v)", round, i, h, want, err)
			}
		}
		// The tree extends the last checkpoint the child signed.
		if _, err := l.Checkpoint(context.Background()); err != nil {
			t.Fatalf("round %d: checkpoint after crash: %v", round, err)
		}
		if err := l.Close(); err != nil {
			t.Fatal(err)
		}
		r, err := audit.CheckFile(context.Background(), path, keys, nil, nil)
		if err != nil || !r.OK() {
			t.Fatalf("round %d: log does not verify after crash: %v %v", round, err, r.Failures)
		}
		t.Logf("round %d: %d acks this round, %d total, tree size %d", round, n, len(acked), size)
	}
	if len(acked) == 0 {
		t.Fatal("the child acknowledged nothing")
	}
}
