package cli

import (
	"bufio"
	"encoding/csv"
	"encoding/json"
	"flag"
	"fmt"
	"image"
	"image/color"
	"image/png"
	"math"
	"math/rand/v2"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
)

// updateExamples regenerates examples/data (go test ./cli -run
// TestExampleData -update-examples).
var updateExamples = flag.Bool("update-examples", false, "regenerate examples/data")

// exampleData is where the README's newcomer commands find their data,
// relative to the repository root.
const exampleData = "examples/data"

// TestExampleData: examples/data holds exactly what the generators below
// write (a fixed seed), so the README's data can be regenerated and
// nothing in it is hand-edited.
func TestExampleData(t *testing.T) {
	root := filepath.Join("..", exampleData)
	if *updateExamples {
		if err := os.RemoveAll(root); err != nil {
			t.Fatal(err)
		}
		writeExampleData(t, root)
	}
	fresh := t.TempDir()
	writeExampleData(t, fresh)
	err := filepath.WalkDir(fresh, func(path string, d os.DirEntry, err error) error {
		if err != nil || d.IsDir() {
			return err
		}
		rel, _ := filepath.Rel(fresh, path)
		want, _ := os.ReadFile(path)
		got, err := os.ReadFile(filepath.Join(root, rel))
		if err != nil || string(got) != string(want) {
			t.Errorf("%s/%s differs from its generator (go test ./cli -run TestExampleData -update-examples): %v", exampleData, rel, err)
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
}

// writeExampleData writes patients.csv (a synthetic table with a header
// and a named, string-valued label column) and shapes/ (an image folder of
// three classes of 16×16 gray PNGs) under dir.
func writeExampleData(t *testing.T, dir string) {
	t.Helper()
	if err := os.MkdirAll(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	r := rand.New(rand.NewPCG(26, 1))

	// patients.csv and patients-test.csv: synthetic patients, eight
	// measurements, and an outcome of low, medium or high risk that
	// shifts them; shapes/ and shapes-test/: noisy 16×16 drawings of
	// three shapes.
	writePatients(t, r, filepath.Join(dir, "patients.csv"), 3000)
	writePatients(t, r, filepath.Join(dir, "patients-test.csv"), 600)
	writeShapes(t, r, filepath.Join(dir, "shapes"), 400)
	writeShapes(t, r, filepath.Join(dir, "shapes-test"), 50)
}

func writePatients(t *testing.T, r *rand.Rand, path string, n int) {
	t.Helper()
	f, err := os.Create(path)
	if err != nil {
		t.Fatal(err)
	}
	w := csv.NewWriter(bufio.NewWriter(f))
	// Each measurement is written scaled to [0, 1] by a fixed, public
	// reference range (lo, hi), as a user should prepare data: scaling by
	// the private data's own statistics would need privacy budget too.
	cols := []struct {
		name       string
		mean, step float64 // the low-risk mean and the shift per risk level
		sd         float64
		lo, hi     float64
	}{
		{"age", 45, 9, 12, 18, 90}, {"bmi", 24, 2.5, 3.5, 15, 45}, {"systolic_bp", 118, 9, 12, 90, 180},
		{"cholesterol", 4.8, 0.5, 0.8, 3, 8}, {"glucose", 5.2, 0.7, 0.9, 3.5, 10}, {"heart_rate", 68, 4, 9, 45, 110},
		{"smoker", 0.15, 0.2, 0, 0, 1}, {"exercise_hours", 4, -1.2, 1.5, 0, 10},
	}
	risks := []string{"low", "medium", "high"}
	var head []string
	for _, c := range cols {
		head = append(head, c.name)
	}
	w.Write(append(head, "outcome"))
	for range n {
		k := r.IntN(3)
		var rec []string
		for _, c := range cols {
			v := c.mean + float64(k)*c.step
			if c.sd == 0 { // a yes/no column with probability v
				rec = append(rec, strconv.Itoa(boolInt(r.Float64() < v)))
				continue
			}
			v = (v + c.sd*r.NormFloat64() - c.lo) / (c.hi - c.lo)
			rec = append(rec, strconv.FormatFloat(math.Min(1, math.Max(0, v)), 'f', 3, 64))
		}
		w.Write(append(rec, risks[k]))
	}
	w.Flush()
	if err := w.Error(); err != nil {
		t.Fatal(err)
	}
	if err := f.Close(); err != nil {
		t.Fatal(err)
	}
}

func writeShapes(t *testing.T, r *rand.Rand, dir string, perClass int) {
	t.Helper()
	for _, shape := range []string{"circle", "square", "triangle"} {
		sub := filepath.Join(dir, shape)
		if err := os.MkdirAll(sub, 0o755); err != nil {
			t.Fatal(err)
		}
		for i := range perClass {
			img := image.NewGray(image.Rect(0, 0, 16, 16))
			cx, cy := 7.5+2*r.NormFloat64(), 7.5+2*r.NormFloat64()
			size := 3.5 + 1.5*r.Float64()
			for y := range 16 {
				for x := range 16 {
					dx, dy := float64(x)-cx, float64(y)-cy
					var in bool
					switch shape {
					case "circle":
						in = dx*dx+dy*dy <= size*size
					case "square":
						in = math.Abs(dx) <= size*0.85 && math.Abs(dy) <= size*0.85
					case "triangle":
						in = dy <= size && dy >= -size && math.Abs(dx) <= (dy+size)/2
					}
					v := 30 + 40*r.Float64()
					if in {
						v = 200 + 55*r.Float64()
					}
					img.SetGray(x, y, color.Gray{Y: uint8(v)})
				}
			}
			out, err := os.Create(filepath.Join(sub, fmt.Sprintf("%03d.png", i)))
			if err != nil {
				t.Fatal(err)
			}
			if err := png.Encode(out, img); err != nil {
				t.Fatal(err)
			}
			if err := out.Close(); err != nil {
				t.Fatal(err)
			}
		}
	}
}

func boolInt(b bool) int {
	if b {
		return 1
	}
	return 0
}

// readmeLocalCommands returns the README's `coordinator local` commands on
// the example data: the lines of its "Your data" section that start with
// "go run ./cmd/coordinator local --data-path examples/data", split into
// arguments after the command.
func readmeLocalCommands(t *testing.T) [][]string {
	t.Helper()
	readme, err := os.ReadFile(filepath.Join("..", "README.md"))
	if err != nil {
		t.Fatal(err)
	}
	const prefix = "go run ./cmd/coordinator "
	var cmds [][]string
	for _, line := range strings.Split(string(readme), "\n") {
		line = strings.TrimSpace(strings.TrimPrefix(strings.TrimSpace(line), "$ "))
		if strings.HasPrefix(line, prefix+"local --data-path "+exampleData) {
			cmds = append(cmds, strings.Fields(strings.TrimPrefix(line, prefix)))
		}
	}
	return cmds
}

// TestREADMENewcomerRuns is issue 26's newcomer test: the README's
// commands that train on a user's data — a CSV with a header and a named,
// string-valued label column, and a folder of images per class — each
// one command, run as written from the repository root (plus a data dir
// of the test's, no progress bar and fewer steps), train to the end under
// a name derived from the data and report a test accuracy.
func TestREADMENewcomerRuns(t *testing.T) {
	cmds := readmeLocalCommands(t)
	if len(cmds) != 2 {
		t.Fatalf("README.md has %d `go run ./cmd/coordinator local --data-path %s…` commands, want 2 (a CSV and an image folder): %q",
			len(cmds), exampleData, cmds)
	}
	t.Chdir(filepath.Join(".."))
	for _, args := range cmds {
		t.Run(args[2], func(t *testing.T) {
			// As written, but 20 steps (the race detector makes 200 slow)
			// in a data dir of the test's.
			out, _, err := runCmd(t, append(args, "--data-dir", t.TempDir(), "--progress", "off", "--max-steps", "20")...)
			if err != nil {
				t.Fatalf("coordinator %s: %v\n%s", strings.Join(args, " "), err, out)
			}
			name := strings.TrimSuffix(filepath.Base(args[2]), filepath.Ext(args[2]))
			for _, want := range []string{"trained " + name + "-", " for 20 steps (max steps reached)", "test accuracy", "held-out examples"} {
				if !strings.Contains(out, want) {
					t.Errorf("coordinator %s: the output lacks %q:\n%s", strings.Join(args, " "), want, out)
				}
			}
		})
	}
}

// TestLocalTrainsOnTextFolder: a folder of .txt documents per class is
// one command too: the hashing tokenizer makes token sequences, and the
// textbag preset takes their length, vocabulary and classes.
func TestLocalTrainsOnTextFolder(t *testing.T) {
	dir := t.TempDir()
	r := rand.New(rand.NewPCG(3, 4))
	words := map[string][]string{
		"sports":  strings.Fields("goal match team score win league coach player season ball"),
		"weather": strings.Fields("rain cloud sunny storm wind snow forecast cold warm fog"),
	}
	for class, vocab := range words {
		if err := os.MkdirAll(filepath.Join(dir, "docs", class), 0o755); err != nil {
			t.Fatal(err)
		}
		for i := range 300 {
			var doc []string
			for range 12 {
				doc = append(doc, vocab[r.IntN(len(vocab))])
			}
			writeFile(t, filepath.Join(dir, "docs", class, fmt.Sprintf("%d.txt", i)), strings.Join(doc, " "))
		}
	}
	out, _, err := runCmd(t, "local", "--data-path", filepath.Join(dir, "docs"), "--model", "textbag", "--seq-len", "16",
		"--vocab", "1000", "--batch-size", "60", "--max-steps", "10", "--data-dir", filepath.Join(dir, "d"), "--progress", "off", "--json")
	if err != nil {
		t.Fatalf("local on a text folder: %v\n%s", err, out)
	}
	var res localResult
	if err := json.Unmarshal([]byte(out), &res); err != nil {
		t.Fatal(err)
	}
	if res.Run != "docs-textbag" || res.Steps != 10 {
		t.Errorf("run %q, %d steps; want docs-textbag, 10", res.Run, res.Steps)
	}
	m, err := os.ReadFile(res.Model)
	if err != nil || !strings.Contains(string(m), `\"vocab\":1000`) || !strings.Contains(string(m), `\"input\":[16]`) {
		t.Errorf("the model's spec does not say vocabulary 1000 and input [16] (%v)", err)
	}
}
