package cli

import (
	"encoding/csv"
	"encoding/json"
	"fmt"
	"math"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"testing"
)

// readCSVFile reads a whole CSV file.
func readCSVFile(t *testing.T, path string) [][]string {
	t.Helper()
	f, err := os.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	recs, err := csv.NewReader(f).ReadAll()
	if err != nil {
		t.Fatal(err)
	}
	return recs
}

// TestPredictByName trains the patients file briefly with `local`, whose
// model.safetensors then names its classes and feature columns; `predict`
// on the test file prints the accuracy and per-class precision and
// recall of the predictions it writes (checked here against the file's
// labels), and the same file with its columns reversed and its label
// column dropped gets the same predictions. Wrong feature counts, unknown
// class names and a missing model are one-line errors.
func TestPredictByName(t *testing.T) {
	dir := t.TempDir()
	out, err := run(t, "local", "--data-path", filepath.Join("..", "examples", "data", "patients.csv"), "--label-column", "outcome",
		"--batch-size", "300", "--max-steps", "20", "--eval-every", "0", "--round-timeout", "20s",
		"--data-dir", dir, "--progress", "off", "--run", "t-predict", "--json")
	if err != nil {
		t.Fatal(err)
	}
	var res localResult
	if err := json.Unmarshal([]byte(out), &res); err != nil {
		t.Fatalf("not JSON: %v\n%s", err, out)
	}
	_, _, meta := readModelFile(t, res.Model)
	testFile := filepath.Join("..", "examples", "data", "patients-test.csv")
	rows := readCSVFile(t, testFile)
	header := rows[0]
	wantFeatures, _ := json.Marshal(slices.DeleteFunc(slices.Clone(header), func(c string) bool { return c == "outcome" }))
	for k, v := range map[string]string{"classes": `["high","low","medium"]`, "features": string(wantFeatures), "label_column": "outcome"} {
		if meta[k] != v {
			t.Errorf("metadata %s = %q, want %q", k, meta[k], v)
		}
	}

	preds := filepath.Join(t.TempDir(), "pred.csv")
	pout, err := run(t, "predict", res.Model, testFile, "--out", preds, "--probabilities")
	if err != nil {
		t.Fatal(err)
	}
	got := readCSVFile(t, preds)
	classes := []string{"high", "low", "medium"}
	if !slices.Equal(got[0], []string{"row", "predicted", "p_high", "p_low", "p_medium"}) || len(got) != len(rows) {
		t.Fatalf("predictions: header %q, %d rows for %d examples", got[0], len(got)-1, len(rows)-1)
	}
	label := slices.Index(header, "outcome")
	correct := 0
	tp, predicted, actual := map[string]int{}, map[string]int{}, map[string]int{}
	for i, rec := range got[1:] {
		if rec[0] != strconv.Itoa(i) {
			t.Fatalf("row %d is numbered %s", i, rec[0])
		}
		var sum, best float64
		argmax := ""
		for j, s := range rec[2:] {
			p, err := strconv.ParseFloat(s, 64)
			if err != nil || p < 0 || p > 1 {
				t.Fatalf("row %d: probability %q", i, s)
			}
			sum += p
			if p > best {
				best, argmax = p, classes[j]
			}
		}
		if math.Abs(sum-1) > 1e-6 || argmax != rec[1] {
			t.Fatalf("row %d: probabilities %q sum to %v, predicted %s", i, rec[2:], sum, rec[1])
		}
		y := rows[i+1][label]
		predicted[rec[1]]++
		actual[y]++
		if rec[1] == y {
			correct++
			tp[y]++
		}
	}
	n := len(rows) - 1
	if want := fmt.Sprintf("accuracy %.2f%% (%d of %d)", 100*float64(correct)/float64(n), correct, n); !strings.Contains(pout, want) {
		t.Errorf("predict said\n%s\nwant %q", pout, want)
	}
	for _, c := range classes {
		re := regexp.MustCompile(`(?m)^` + c + ` +(\S+) +(\S+) +(\d+) +(\d+)$`)
		m := re.FindStringSubmatch(pout)
		want := []string{fmt.Sprintf("%.2f%%", 100*float64(tp[c])/float64(predicted[c])), fmt.Sprintf("%.2f%%", 100*float64(tp[c])/float64(actual[c])),
			strconv.Itoa(predicted[c]), strconv.Itoa(actual[c])}
		if predicted[c] == 0 {
			want[0] = "-"
		}
		if m == nil || !slices.Equal(m[1:], want) {
			t.Errorf("class %s: line %q, want precision, recall, predicted, actual %q", c, m, want)
		}
	}
	if correct < n/2 {
		t.Errorf("%d of %d correct after 20 steps: the model did not train", correct, n)
	}

	// The columns reversed and the label dropped: the same predictions,
	// chosen by name; no accuracy.
	unlabeled := filepath.Join(t.TempDir(), "unlabeled.csv")
	var b strings.Builder
	w := csv.NewWriter(&b)
	for _, rec := range rows {
		var r []string
		for j := len(rec) - 1; j >= 0; j-- {
			if j != label {
				r = append(r, rec[j])
			}
		}
		w.Write(r)
	}
	w.Flush()
	if err := os.WriteFile(unlabeled, []byte(b.String()), 0o600); err != nil {
		t.Fatal(err)
	}
	preds2 := filepath.Join(t.TempDir(), "pred2.csv")
	pout, err = run(t, "predict", res.Model, unlabeled, "--out", preds2)
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(pout, `no labels (no column "outcome")`) || strings.Contains(pout, "accuracy ") {
		t.Errorf("predict on unlabeled data said\n%s", pout)
	}
	for i, rec := range readCSVFile(t, preds2) {
		if !slices.Equal(rec, got[i][:2]) {
			t.Fatalf("row %d: %q with the columns reordered, %q before", i, rec, got[i][:2])
		}
	}
	// The data dir itself is a model too.
	if dout, err := run(t, "predict", dir, testFile); err != nil || !strings.Contains(dout, fmt.Sprintf("(%d of %d)", correct, n)) {
		t.Errorf("predict DATA_DIR: %v\n%s", err, dout)
	}

	bad := func(name, content string) string {
		p := filepath.Join(t.TempDir(), name)
		if err := os.WriteFile(p, []byte(content), 0o600); err != nil {
			t.Fatal(err)
		}
		return p
	}
	for _, tc := range []struct {
		name  string
		args  []string
		wants []string
	}{
		{"wrong feature count", []string{res.Model, bad("few.csv", "age,outcome\n0.5,low\n"), "--feature-columns", "age"},
			[]string{"1 features per row", "the model reads 8 features: age, bmi"}},
		{"missing feature column", []string{res.Model, bad("nobmi.csv", "age,outcome\n0.5,low\n")}, []string{`no column "bmi"`}},
		{"unknown class", []string{res.Model, bad("extreme.csv", strings.Join(header, ",")+"\n0,0,0,0,0,0,0,0,extreme\n")},
			[]string{`label "extreme" is not one of the class names ["high", "low", "medium"]`}},
		{"missing model", []string{filepath.Join(t.TempDir(), "none.safetensors"), testFile}, []string{"none.safetensors: no such file"}},
		{"not a model", []string{testFile, testFile}, []string{"bad safetensors file"}},
		{"probabilities without out", []string{res.Model, testFile, "--probabilities"}, []string{"--probabilities needs --out"}},
	} {
		_, err := run(t, append([]string{"predict"}, tc.args...)...)
		if err == nil {
			t.Errorf("%s: no error", tc.name)
			continue
		}
		for _, want := range tc.wants {
			if !strings.Contains(err.Error(), want) || strings.Contains(err.Error(), "\n") {
				t.Errorf("%s: error %q, want one line containing %q", tc.name, err, want)
			}
		}
	}
}
