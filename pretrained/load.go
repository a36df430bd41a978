package pretrained

import (
	"bufio"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"

	"github.com/dpcluster/dpcluster/checkpoint"
	"github.com/dpcluster/dpcluster/model"
)

// WeightsFile and ConfigFile are the files of a checkpoint folder, as
// save_pretrained writes them.
const (
	WeightsFile = "model.safetensors"
	ConfigFile  = "config.json"
)

// Mapping is a checkpoint configuration's model in the engine and the
// correspondence between the engine's parameters and the checkpoint's
// tensors, both ways.
type Mapping struct {
	// Config is the checkpoint's configuration and ConfigJSON its
	// config.json as read (Export writes it back, amended).
	Config     checkpoint.Config
	ConfigJSON []byte
	Options    Options
	plan       plan
	model      *model.Model
}

// NewMapping returns the mapping of the model that configJSON (a
// config.json) describes, with opt's head and length.
func NewMapping(configJSON []byte, opt Options) (*Mapping, error) {
	cfg, err := checkpoint.ParseConfig(configJSON)
	if err != nil {
		return nil, err
	}
	p, err := planFor(cfg, opt)
	if err != nil {
		return nil, err
	}
	m, err := model.New(p.spec)
	if err != nil {
		return nil, fmt.Errorf("pretrained: the %s model: %w", cfg.Family, err)
	}
	cfg.NumLabels, cfg.Labels = p.opt.Classes, nil
	return &Mapping{Config: cfg, ConfigJSON: configJSON, Options: p.opt, plan: p, model: m}, nil
}

// Spec returns the engine's spec of the model.
func (mp *Mapping) Spec() model.Spec { return mp.plan.spec }

// Model returns the engine's model (the pure-Go back end).
func (mp *Mapping) Model() *model.Model { return mp.model }

// Expected returns the tensors the model has in a checkpoint, as
// checkpoint.Config.Expected lists them for the classification head with
// Options.Classes outputs.
func (mp *Mapping) Expected() []checkpoint.Expected {
	return mp.Config.Expected(checkpoint.HeadClassifier)
}

// Checkpoint is a checkpoint folder opened for import: its mapping, its
// weights file checked against the model and hashed. Nothing is read into
// θ until Init.
type Checkpoint struct {
	*Mapping
	// Dir is the folder; WeightsSHA256 the hex SHA-256 of its model.safetensors,
	// which identifies the weights (the run records it: every replica and
	// node must import the same bytes).
	Dir, WeightsSHA256 string
	// Report is what checkpoint.Check found: the tensors present, those
	// initialized afresh (Report.Fresh: a new classification head), the
	// file's tensors the model does not use (Report.Unexpected).
	Report checkpoint.Report
	file   *checkpoint.File
}

// Open opens the checkpoint folder dir (config.json, model.safetensors
// and, for BERT, vocab.txt, whose [SEP] id the token types are read
// from) for a model with opt's length and head; opt.SepID is set from
// vocab.txt. It checks every tensor's name and shape against the model
// and hashes the weights file, reading no weight into memory. Errors are
// one line: a folder without config.json (checkpoint.ErrNoConfig), a
// configuration of an unknown or unsupported architecture
// (checkpoint.ErrConfig, ErrUnsupported), a truncated or malformed
// weights file (checkpoint.ErrFormat), missing tensors or tensors of the
// wrong shape, with both shapes (checkpoint.ErrMismatch). The caller
// closes the Checkpoint.
func Open(dir string, opt Options) (*Checkpoint, error) {
	raw, err := os.ReadFile(filepath.Join(dir, ConfigFile))
	if err != nil {
		// ReadConfig words the missing file and names what the folder holds.
		if _, cerr := checkpoint.ReadConfig(dir); cerr != nil {
			return nil, cerr
		}
		return nil, err
	}
	cfg, err := checkpoint.ParseConfig(raw)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", filepath.Join(dir, ConfigFile), err)
	}
	if cfg.Family == checkpoint.BERT && cfg.TypeVocab >= 2 {
		if opt.SepID, err = sepID(dir); err != nil {
			return nil, err
		}
	}
	path := filepath.Join(dir, WeightsFile)
	f, err := checkpoint.Open(path)
	if err != nil {
		return nil, err
	}
	ck, err := check(dir, raw, f, opt)
	if err != nil {
		f.Close()
		return nil, err
	}
	return ck, nil
}

// check builds the mapping of the checkpoint whose config.json is raw and
// whose weights f holds, checks the tensors against it and hashes the
// weights file (Open).
func check(dir string, raw []byte, f *checkpoint.File, opt Options) (*Checkpoint, error) {
	path := filepath.Join(dir, WeightsFile)
	hash, err := hashFile(path)
	if err != nil {
		return nil, err
	}
	mp, err := NewMapping(raw, opt)
	if err != nil {
		return nil, fmt.Errorf("checkpoint %s: %w", dir, err)
	}
	rep, err := checkpoint.Check(f, mp.Expected())
	if err != nil {
		return nil, fmt.Errorf("%s: %w", path, err)
	}
	return &Checkpoint{Mapping: mp, Dir: dir, WeightsSHA256: hash, Report: rep, file: f}, nil
}

// Close closes the weights file.
func (c *Checkpoint) Close() error { return c.file.Close() }

// sepID returns the line number of [SEP] in dir/vocab.txt: its id.
func sepID(dir string) (int, error) {
	path := filepath.Join(dir, "vocab.txt")
	f, err := os.Open(path)
	if err != nil {
		return -1, fmt.Errorf("pretrained: a BERT checkpoint needs its vocab.txt, whose [SEP] ends a pair's first segment: %w", err)
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	sc.Buffer(make([]byte, 1<<16), 1<<20)
	for id := 0; sc.Scan(); id++ {
		if strings.TrimRight(sc.Text(), "\r") == "[SEP]" {
			return id, nil
		}
	}
	if err := sc.Err(); err != nil {
		return -1, fmt.Errorf("pretrained: %s: %w", path, err)
	}
	return -1, fmt.Errorf("pretrained: %s has no [SEP] token, which ends a pair's first segment", path)
}

// hashFile returns the hex SHA-256 of the file at path.
func hashFile(path string) (string, error) {
	f, err := os.Open(path)
	if err != nil {
		return "", err
	}
	defer f.Close()
	h := sha256.New()
	if _, err := io.Copy(h, f); err != nil {
		return "", fmt.Errorf("pretrained: hashing %s: %w", path, err)
	}
	return hex.EncodeToString(h.Sum(nil)), nil
}

// Init writes θ₀ into theta (the model's NumParams values): the
// parameters the checkpoint lacks (Report.Fresh) as the engine
// initializes them from seed, every other one read from the weights file,
// converted to float32 and, for GPT-2's Conv1D weights, transposed to the
// engine's [out, in]. Reading goes tensor by tensor into theta; only a
// transposed tensor passes through a buffer of its own size, so a
// checkpoint is never held twice.
func (c *Checkpoint) Init(theta []float32, seed uint64) error {
	if err := c.model.Init(theta, seed); err != nil {
		return err
	}
	return c.read(func(name string) ([]float32, bool) { return c.model.Param(theta, name) })
}

// read reads every tensor the checkpoint has into the engine parameter it
// binds, whose values values returns.
func (c *Checkpoint) read(values func(param string) ([]float32, bool)) error {
	file := map[string]string{}
	for _, s := range c.Report.Present {
		file[s.Name] = s.File
	}
	var buf []float32
	for _, b := range c.plan.bindings {
		dst, ok := values(b.param)
		if !ok {
			return fmt.Errorf("pretrained: no engine parameter %q (a bug in the mapping)", b.param)
		}
		shape := c.paramShape(b.param)
		per := len(dst) / len(b.parts)
		for k, part := range b.parts {
			name, ok := file[part]
			if !ok {
				continue // initialized afresh, Report.Fresh
			}
			out := dst[k*per : (k+1)*per]
			if !b.transposed {
				if err := c.file.ReadFloat32(name, out); err != nil {
					return err
				}
				continue
			}
			buf = grow(buf, per)
			if err := c.file.ReadFloat32(name, buf); err != nil {
				return err
			}
			// The file holds [in, out]; the engine [out, in].
			transpose(out, buf, shape[1], shape[0]/len(b.parts))
		}
	}
	return nil
}

// paramShape returns the shape of the engine's parameter name.
func (mp *Mapping) paramShape(name string) []int {
	for _, p := range mp.model.Params() {
		if p.Name == name {
			return p.Shape
		}
	}
	return nil
}

func grow(b []float32, n int) []float32 {
	if cap(b) < n {
		return make([]float32, n)
	}
	return b[:n]
}

// transpose writes the rows×cols matrix src, transposed, into dst
// (cols×rows).
func transpose(dst, src []float32, rows, cols int) {
	for r := range rows {
		for c := range cols {
			dst[c*rows+r] = src[r*cols+c]
		}
	}
}
