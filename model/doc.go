// Package model builds neural networks from a JSON spec and computes, for a
// node's private batch, the sum of per-example gradients each clipped to L2
// norm C — the quantity a dpcluster node sends to the coordinator — plus the
// non-private mean gradient and evaluation metrics.
//
// A Spec is a list of layers (linear, relu, tanh, gelu, gelu_tanh, conv2d,
// maxpool, avgpool, flatten, embeddingbag, layernorm, and for token
// sequences embedding, attention, residual blocks, meanpool, firsttoken and
// lasttoken: enough for BERT-, RoBERTa- and GPT-2-style models) with a
// softmax cross-entropy loss, per example or, for language models, per next
// token (NextToken); presets "logreg", "mlp", "cnn", "textbag" and
// "transformer" are built in. A Model holds
// the validated layout: all parameters live in one flat []float32 ("theta")
// with named tensor views (Params), so a whole model is one vector on the
// wire and in the optimizer. Spec.Hash (SHA-256 of canonical JSON) lets nodes
// check that they run the same model.
//
// Gradients are computed in a Workspace that owns every buffer for batches up
// to a maximum size:
//
//	m, err := model.New(spec)
//	theta := make([]float32, m.NumParams())
//	err = m.Init(theta, seed)
//	ws, err := m.NewWorkspace(maxBatch)
//	sum := make([]float32, m.NumParams())
//	n, err := ws.ClippedSum(sum, theta, x, y, clipNorm) // Σᵢ clip(gᵢ), n = len(y)
//
// ClippedSum never materializes per-example gradients where a ghost norm
// works; see its doc comment for the algorithm and sources. Matrix products go
// through a Backend: pure-Go gonum by default, OpenBLAS with -tags openblas.
package model
