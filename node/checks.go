package node

import (
	"fmt"
	"math"

	"github.com/dpcluster/dpcluster/model"
	"github.com/dpcluster/dpcluster/transport"
)

// checkRound validates a RoundStart from the wire and returns why it is
// unusable, or "". The reasons name public constants only.
func checkRound(rs transport.RoundStart, numParams int) string {
	switch {
	case rs.Step == 0:
		return "step 0"
	case !(rs.SampleRate > 0 && rs.SampleRate <= 1):
		return fmt.Sprintf("sample rate %v not in (0, 1]", rs.SampleRate)
	case model.CheckClipNorm(rs.ClipNorm) != nil:
		return fmt.Sprintf("clip norm %v not in [%v, %v]", rs.ClipNorm, model.MinClipNorm, model.MaxClipNorm)
	case rs.Deadline <= 0:
		return "no deadline"
	}
	if len(rs.Params) > 0 {
		if err := checkParams(rs.Params, numParams); err != nil {
			return "inline params: " + err.Error()
		}
	}
	return ""
}

// checkRun returns why rs is not a round of the run this node was
// configured for, or "": its sampling rate q or clip norm C is not the
// run's (cfg.SampleRate, cfg.ClipNorm), or its model hash is not this
// node's model's (an empty hash, from an older leader, is refused too).
//
// This is the node's only check of a round's privacy parameters. The
// privacy of a step rests on them: the ledger charges every step as the
// Poisson-subsampled Gaussian mechanism with the run's q and σ at
// sensitivity C (dp-adambc.tex, Algorithm 1: "Take a random batch with
// sampling probability B/N", and g̃_t = (Σ clip_C(g_i) + z_t)/B with
// z_t ~ N(0, σ²C²I); Appendix E, q = L/N). A round naming q = 1 and
// C = 1e30 would make the node send its whole shard's unclipped gradient
// sum, which that charge does not cover. The comparison is exact (error
// bound 0): the node command and the replicas compute q = B/N with the same
// function (one correctly rounded IEEE-754 division of the same float64 B
// by the same integer N < 2⁵³, which converts exactly), C is the correctly
// rounded parse of the same decimal text of the run file (or flag), and
// msgpack carries float64 bits unchanged; any other value is a different
// run, or a forgery. The reasons name public constants only.
func checkRun(rs transport.RoundStart, cfg Config, modelHash string) string {
	switch {
	case rs.SampleRate != cfg.SampleRate:
		return fmt.Sprintf("sample rate q = %v, the run's is %v", rs.SampleRate, cfg.SampleRate)
	case rs.ClipNorm != cfg.ClipNorm:
		return fmt.Sprintf("clip norm C = %v, the run's is %v", rs.ClipNorm, cfg.ClipNorm)
	case rs.ModelHash != modelHash:
		return fmt.Sprintf("model hash %q, this node's model is %q", rs.ModelHash, modelHash)
	}
	return ""
}

// checkParams reports a parameter vector of the wrong length or with a
// non-finite value (named by index only).
func checkParams(v transport.Vector, numParams int) error {
	if len(v) != numParams {
		return fmt.Errorf("%d values, model has %d", len(v), numParams)
	}
	const exp = 0x7f800000 // a float32 is NaN or ±Inf iff its exponent bits are all ones
	for i, x := range v {
		if math.Float32bits(x)&exp == exp {
			return fmt.Errorf("non-finite value at index %d", i)
		}
	}
	return nil
}
