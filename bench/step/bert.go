package main

import (
	"encoding/json"
	"fmt"
	"math/rand/v2"
	"os"
	"path/filepath"
	"strconv"
	"strings"

	"github.com/dpcluster/dpcluster/model"
	"github.com/dpcluster/dpcluster/pretrained"
)

// BERT-shaped encoders. A run of one trains on the real path of a
// fine-tuning run (`coordinator local --init-from`): a checkpoint folder
// of random weights that the parent writes once per model and shape
// (writeBERTFixture: config.json, model.safetensors, and a WordPiece
// vocab.txt of vocab_size made-up words), and the fortunes-category
// dataset read from a folder of made-up fortunes in those words, each
// longer than the sequence, so that every example fills all its tokens
// (no padding) as a side-by-side in PyTorch computes them.

// bertShape is a BERT encoder's configuration (config.json's keys).
type bertShape struct {
	Layers, Hidden, Heads, Intermediate, Vocab, Positions, Types int
}

// bertShapes are the encoders -models names: bert-base is BERT-base
// (bert-base-uncased's configuration), bert-small the same vocabulary and
// positions with 4 layers 256 wide (Google's BERT-Mini, L-4 H-256 A-4), for
// a quick run.
var bertShapes = map[string]bertShape{
	"bert-base":  {Layers: 12, Hidden: 768, Heads: 12, Intermediate: 3072, Vocab: 30522, Positions: 512, Types: 2},
	"bert-small": {Layers: 4, Hidden: 256, Heads: 4, Intermediate: 1024, Vocab: 30522, Positions: 512, Types: 2},
}

// bertClasses is the classification head's outputs: the fixture's two
// categories of fortunes.
const bertClasses = 2

// The fixture's layout: the checkpoint folder and the fortunes folder
// under the fixture's directory; the categories and fortunes per category
// (at least dataset.MinCategoryFortunes each: 120 documents, of which
// fortunes-category's public split keeps 108 for training).
const (
	fixtureCheckpoint = "checkpoint"
	fixtureText       = "text"
	fixtureFortunes   = 60
	fixtureSeed       = 1
)

var fixtureCategories = []string{"alpha", "beta"}

// configJSON is the shape's config.json, as BertForSequenceClassification
// writes it.
func (s bertShape) configJSON() ([]byte, error) {
	return json.MarshalIndent(map[string]any{
		"model_type": "bert", "architectures": []string{"BertForSequenceClassification"},
		"num_hidden_layers": s.Layers, "hidden_size": s.Hidden, "num_attention_heads": s.Heads,
		"intermediate_size": s.Intermediate, "vocab_size": s.Vocab, "max_position_embeddings": s.Positions,
		"type_vocab_size": s.Types, "hidden_act": "gelu", "layer_norm_eps": 1e-12, "pad_token_id": 0,
		"num_labels": bertClasses,
	}, "", "  ")
}

// vocab is the fixture's WordPiece vocabulary: BERT's special tokens, then
// made-up words w5, w6, ... up to the shape's vocabulary size.
func (s bertShape) vocab() []string {
	v := []string{"[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"}
	for len(v) < s.Vocab {
		v = append(v, fmt.Sprintf("w%d", len(v)))
	}
	return v
}

// sepID is [SEP]'s id in vocab.
const sepID = 3

// writeBERTFixture writes the checkpoint of shape's encoder with random
// weights (the engine's initialization, seed fixtureSeed) for sequences of
// seqLen tokens, and the fortunes, under dir.
func writeBERTFixture(dir string, shape bertShape, seqLen int) error {
	cfg, err := shape.configJSON()
	if err != nil {
		return err
	}
	mp, err := pretrained.NewMapping(cfg, pretrained.Options{SeqLen: seqLen, Classes: bertClasses, SepID: sepID})
	if err != nil {
		return err
	}
	theta := make([]float32, mp.Model().NumParams())
	if err := mp.Model().Init(theta, fixtureSeed); err != nil {
		return err
	}
	ck := filepath.Join(dir, fixtureCheckpoint)
	if err := mp.Export(ck, theta, fixtureCategories, nil); err != nil {
		return err
	}
	words := shape.vocab()
	if err := os.WriteFile(filepath.Join(ck, "vocab.txt"), []byte(strings.Join(words, "\n")+"\n"), 0o644); err != nil {
		return err
	}
	text := filepath.Join(dir, fixtureText)
	if err := os.MkdirAll(text, 0o755); err != nil {
		return err
	}
	rng := rand.New(rand.NewPCG(fixtureSeed, 2))
	for _, cat := range fixtureCategories {
		var b strings.Builder
		for range fixtureFortunes {
			for i := range seqLen {
				if i > 0 {
					b.WriteByte(' ')
				}
				b.WriteString(words[5+rng.IntN(len(words)-5)])
			}
			b.WriteString("\n%\n")
		}
		if err := os.WriteFile(filepath.Join(text, cat), []byte(b.String()), 0o644); err != nil {
			return err
		}
	}
	return nil
}

// setting is what trains in a run of a BERT-shaped encoder: everything
// (trainable nil), or the layers its patterns name (model.Spec.Trainable,
// local's --trainable). Every way of choosing what trains reaches the run
// through a setting's two methods, local's flags (args) and the spec the
// benchmark reports and times the engine on (spec), so that another way
// (adapters with a rank, say) is one more field read in both.
type setting struct {
	name      string
	trainable []string
	loraRank  int // LoRA adapters of this rank on the query and value; 0: none
}

// Setting names -trainable takes besides patterns.
const (
	settingFull      = "full"
	settingLastBlock = "last-block"
	// settingLoRA is "lora-r<R>": LoRA adapters of rank R on the query
	// and value (PEFT's default targets), with the classifier trained.
	settingLoRA = "lora-r"
)

// parseSettings reads -trainable: settings separated by ";", each full
// (everything trains), last-block (the last encoder block and the head:
// layer.<L−1>.*, pooler.*, classifier.*), lora-r<R> (LoRA adapters of
// rank R on the query and value, and the classifier) or comma-separated
// patterns over the parameters' names.
func parseSettings(s string) ([]string, error) {
	var out []string
	for _, one := range strings.Split(s, ";") {
		one = strings.TrimSpace(one)
		if one == "" {
			return nil, fmt.Errorf("-trainable %q: an empty setting (full, last-block or patterns)", s)
		}
		out = append(out, one)
	}
	return out, nil
}

// settingFor resolves a -trainable setting for the encoder of shape.
func settingFor(s string, shape bertShape) setting {
	switch s {
	case settingFull:
		return setting{name: s}
	case settingLastBlock:
		return setting{name: s, trainable: []string{fmt.Sprintf("layer.%d.*", shape.Layers-1), "pooler.*", "classifier.*"}}
	}
	if r, err := strconv.Atoi(strings.TrimPrefix(s, settingLoRA)); strings.HasPrefix(s, settingLoRA) && err == nil && r > 0 {
		return setting{name: s, trainable: []string{"classifier.*"}, loraRank: r}
	}
	return setting{name: s, trainable: strings.Split(s, ",")}
}

// args are local's flags for the setting.
func (s setting) args() []string {
	var out []string
	if s.loraRank > 0 {
		out = append(out, "--lora-rank", strconv.Itoa(s.loraRank))
	}
	if len(s.trainable) > 0 {
		out = append(out, "--trainable", strings.Join(s.trainable, ","))
	}
	return out
}

// spec is the checkpoint's model as the setting trains it.
func (s setting) spec(c *pretrained.Checkpoint) (model.Spec, error) {
	base := c.Spec()
	if s.loraRank > 0 {
		var err error
		if base, err = pretrained.WithLoRA(base, c.Config, s.loraRank, 0, nil); err != nil {
			return base, err
		}
	}
	base.Trainable = s.trainable
	return base, nil
}

// bertRun is a BERT-shaped encoder's run in a child: local's flags, the
// model as the run builds it (no frozen values: it sizes the table) and
// the checkpoint it starts from.
type bertRun struct {
	args       []string
	model      *model.Model
	checkpoint string
}

// prepareBERT returns the run of the encoder name in setting st from the
// fixture in dir, written there first if dir has none.
func prepareBERT(name string, st string, dir string, seqLen int) (bertRun, error) {
	shape := bertShapes[name]
	ck := filepath.Join(dir, fixtureCheckpoint)
	if _, err := os.Stat(filepath.Join(ck, pretrained.WeightsFile)); os.IsNotExist(err) {
		if err := writeBERTFixture(dir, shape, seqLen); err != nil {
			return bertRun{}, err
		}
	}
	c, err := pretrained.Open(ck, pretrained.Options{SeqLen: seqLen, Classes: bertClasses})
	if err != nil {
		return bertRun{}, err
	}
	defer c.Close()
	set := settingFor(st, shape)
	spec, err := set.spec(c)
	if err != nil {
		return bertRun{}, fmt.Errorf("-trainable %s: %w", st, err)
	}
	m, err := model.New(spec)
	if err != nil {
		return bertRun{}, fmt.Errorf("-trainable %s: %w", st, err)
	}
	args := append([]string{"--init-from", ck, "--dataset", "fortunes-category", "--data", filepath.Join(dir, fixtureText),
		"--seq-len", fmt.Sprint(seqLen)}, set.args()...)
	return bertRun{args: args, model: m, checkpoint: ck}, nil
}

// engineModel returns r's model ready to compute: itself if it freezes
// nothing, else with the checkpoint's frozen values, read now (after the
// run, whose process held its own single copy).
func (r bertRun) engineModel() (*model.Model, error) {
	if !r.model.Freezes() {
		return r.model, nil
	}
	c, err := pretrained.Open(r.checkpoint, pretrained.Options{SeqLen: r.model.InputShape()[0], Classes: bertClasses})
	if err != nil {
		return nil, err
	}
	defer c.Close()
	full := make([]float32, r.model.NumFullParams())
	if err := c.InitFull(r.model, full, fixtureSeed); err != nil {
		return nil, err
	}
	return r.model.WithFrozen(full)
}
