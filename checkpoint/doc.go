// Package checkpoint reads pretrained checkpoints as Hugging Face saves
// them: a folder with config.json and model.safetensors. Open checks a
// safetensors file's header and layout before any tensor is read, and
// File.ReadFloat32 converts one tensor into a caller's buffer, reading the
// file in chunks, so that a model's θ is the only copy of its weights in
// memory.
package checkpoint
