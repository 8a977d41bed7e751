package main

import (
	"io"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"sigs.k8s.io/yaml"
)

// The deploy manifests run this binary: every argument they give must be
// a flag of its mode, and each mode's required flags must be there.
func TestManifestArgs(t *testing.T) {
	dir := filepath.Join("..", "..", "deploy", "kubernetes", "csi")
	seen := map[string]bool{}
	for _, f := range []string{"controller.yaml", "node.yaml"} {
		b, err := os.ReadFile(filepath.Join(dir, f))
		if err != nil {
			t.Fatal(err)
		}
		for _, doc := range strings.Split(string(b), "\n---") {
			var obj struct {
				Kind string
				Spec struct {
					Template struct {
						Spec struct {
							Containers []struct {
								Name  string
								Image string
								Args  []string
							}
						}
					}
				}
			}
			if err := yaml.Unmarshal([]byte(doc), &obj); err != nil {
				t.Fatalf("%s: %v", f, err)
			}
			for _, c := range obj.Spec.Template.Spec.Containers {
				if !strings.Contains(c.Image, "nvmegate-csi") {
					continue
				}
				if len(c.Args) == 0 {
					t.Fatalf("%s: container %s has no mode", f, c.Name)
				}
				root := newRoot(io.Discard)
				cmd, rest, err := root.Find(c.Args)
				if err != nil || cmd == root {
					t.Fatalf("%s: %v names no mode: %v", f, c.Args, err)
				}
				if err := cmd.ParseFlags(rest); err != nil {
					t.Errorf("%s: container %s: %v", f, c.Name, err)
				}
				if err := cmd.ValidateRequiredFlags(); err != nil {
					t.Errorf("%s: container %s: %v", f, c.Name, err)
				}
				if cmd.Name() == "controller" && !cmd.Flags().Changed("region") {
					t.Errorf("%s: the controller has no --region (it refuses to start without one)", f)
				}
				seen[cmd.Name()] = true
			}
		}
	}
	if !seen["controller"] || !seen["node"] {
		t.Fatalf("modes deployed: %v; want controller and node", seen)
	}
	// The check itself fails on a flag the binary lacks.
	cmd, rest, _ := newRoot(io.Discard).Find([]string{"node", "--no-such-flag=1"})
	if cmd.ParseFlags(rest) == nil {
		t.Fatal("an unknown flag parsed")
	}
}
