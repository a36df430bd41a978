package model

// TransformerLM is a pre-layer-norm decoder-only transformer for next-token
// prediction (Radford et al. 2019, "Language Models are Unsupervised
// Multitask Learners", GPT-2's block order): embedding (tokens and learned
// positions) → blocks × [residual(layernorm → linear 3·width → causal
// attention → linear width), residual(layernorm → linear 4·width → ReLU →
// linear width)] → layernorm → linear vocab at every position, with loss
// NextToken over sequences of context tokens (Input [context+1]).
// TransformerLM(2048, 64, 128, 2, 4) is the "transformer" preset.
func TransformerLM(vocab, context, width, blocks, heads int) Spec {
	layers := transformerLayers(vocab, width, blocks, heads)
	layers = append(layers, LayerSpec{Type: Linear, Out: vocab})
	return Spec{Name: "transformer", Input: []int{context + 1}, Classes: vocab, Loss: NextToken, Layers: layers}
}

// TransformerClassifier is TransformerLM's stack for sequence
// classification: the same embedding and blocks over [seqLen] token ids,
// then layernorm → mean over positions → linear classes, with the softmax
// cross-entropy of the example's label.
func TransformerClassifier(vocab, seqLen, width, blocks, heads, classes int) Spec {
	layers := transformerLayers(vocab, width, blocks, heads)
	layers = append(layers, LayerSpec{Type: MeanPool}, LayerSpec{Type: Linear, Out: classes})
	return Spec{Name: "transformer-classifier", Input: []int{seqLen}, Classes: classes, Layers: layers}
}

// transformerLayers is the embedding, the blocks and the final layer norm.
func transformerLayers(vocab, width, blocks, heads int) []LayerSpec {
	layers := []LayerSpec{{Type: Embedding, Vocab: vocab, Dim: width}}
	for range blocks {
		layers = append(layers,
			LayerSpec{Type: Residual, Layers: []LayerSpec{
				{Type: LayerNorm}, {Type: Linear, Out: 3 * width}, {Type: Attention, Heads: heads}, {Type: Linear, Out: width}}},
			LayerSpec{Type: Residual, Layers: []LayerSpec{
				{Type: LayerNorm}, {Type: Linear, Out: 4 * width}, {Type: ReLU}, {Type: Linear, Out: width}}})
	}
	return append(layers, LayerSpec{Type: LayerNorm})
}

// layerKind names a built layer for messages: its spec type, qualified
// for the sequence forms of linear and layernorm ("linear on a sequence").
func layerKind(l layer, typ string) string {
	switch l.(type) {
	case *seqLinear, *seqLayerNorm:
		return typ + " on a sequence"
	}
	return typ
}
