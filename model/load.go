package model

import (
	"fmt"
	"os"
)

// Load builds the model a run names: the JSON spec in specFile
// (ParseSpec) if specFile is not empty, else the preset (Preset). Errors
// wrap the file's read error (an fs.PathError) or ErrInvalidSpec.
func Load(preset, specFile string) (*Model, error) {
	var (
		spec Spec
		err  error
	)
	if specFile != "" {
		data, rerr := os.ReadFile(specFile)
		if rerr != nil {
			return nil, fmt.Errorf("model: reading the spec: %w", rerr)
		}
		if spec, err = ParseSpec(data); err != nil {
			return nil, fmt.Errorf("%s: %w", specFile, err)
		}
	} else if spec, err = Preset(preset); err != nil {
		return nil, err
	}
	return New(spec)
}
