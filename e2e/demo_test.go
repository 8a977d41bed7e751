package e2e

import (
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"
	"testing"
	"time"
)

// repoRoot is the module root, one level above this package.
func repoRoot(t testing.TB) string {
	t.Helper()
	_, file, _, _ := runtime.Caller(0)
	return filepath.Dir(filepath.Dir(file))
}

// builtByMake returns $env, the path of something make test builds once
// per machine (what). Without it the test is skipped — except under CI,
// where a missing tool must fail the run, not pass it quietly.
func builtByMake(t testing.TB, env, what string) string {
	t.Helper()
	p := os.Getenv(env)
	if p == "" {
		if os.Getenv("CI") == "true" {
			t.Fatalf("%s is not set under CI (make test builds %s and sets it)", env, what)
		}
		t.Skipf("%s is not set: make test builds %s and sets it", env, what)
	}
	return p
}

// buildBinaries builds nvmegated and nvmegate into a temp dir.
func buildBinaries(t testing.TB) string {
	t.Helper()
	bin := t.TempDir()
	cmd := exec.Command("go", "build", "-o", bin+string(os.PathSeparator), "./cmd/...")
	cmd.Dir = repoRoot(t)
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("go build: %v\n%s", err, out)
	}
	return bin
}

// The demo script is the README's first command: it must pass against the
// real binaries, and its summary must report the refusals it checks.
func TestDemoScript(t *testing.T) {
	if testing.Short() {
		t.Skip("e2e: builds and runs the binaries")
	}
	bin := buildBinaries(t)
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, "bash", filepath.Join(repoRoot(t), "scripts", "demo.sh"))
	demo := filepath.Join(t.TempDir(), "demo")
	cmd.Env = append(os.Environ(), "BIN="+bin, "DEMO_DIR="+demo)
	// The script's background gateway shares its stdout: if the script is
	// killed, stop reading rather than wait for that process too.
	cmd.WaitDelay = 10 * time.Second
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("demo failed: %v\n%s", err, out)
	}
	// The nodes' configs are the only place their secrets may be; the
	// scan after the run looks for them everywhere the gateway writes.
	configs, _ := filepath.Glob(filepath.Join(demo, "node*-config.json"))
	issued := 0
	for _, c := range configs {
		data, _ := os.ReadFile(c)
		issued += keepSecrets(t.Name()+": "+filepath.Base(c), data)
	}
	if issued == 0 {
		t.Fatalf("the demo issued no secret into %v: the secret scan would prove nothing", configs)
	}
	lineage, _ := filepath.Glob(filepath.Join(demo, "lineage-*.json"))
	scanFiles(t, append(lineage, filepath.Join(demo, "gateway.log"), filepath.Join(demo, "target-agent.log"),
		filepath.Join(demo, "state", "audit.db"), filepath.Join(demo, "audit-export"), filepath.Join(demo, "checkpoint-1"))...)
	scanQuoted(t.Name()+": demo output", out)
	for _, want := range []string{
		"Demo passed",
		"refused as expected: Error: PermissionDenied",
		"refused as expected: Error: InvalidArgument: namespace.tenant",
	} {
		if !strings.Contains(string(out), want) {
			t.Errorf("demo output lacks %q:\n%s", want, out)
		}
	}
}
