package main

import (
	"fmt"
	"math"
	"slices"
	"strconv"
	"strings"
)

// gridEdge says where h sits in grid along each axis the grid varies
// (η, γ, γ'/Φ): "" when h is strictly inside on every such axis, else the
// edges it is on, such as "η top" or "η bottom, γ' top". An axis with a
// single value in the grid is not an edge: it was not tuned.
func gridEdge(grid []Hyper, h Hyper) string {
	var edges []string
	axis := func(name string, v float64, get func(Hyper) float64) {
		lo, hi := math.Inf(1), math.Inf(-1)
		for _, p := range grid {
			lo, hi = min(lo, get(p)), max(hi, get(p))
		}
		switch {
		case lo == hi:
		case v == hi:
			edges = append(edges, name+" top")
		case v == lo:
			edges = append(edges, name+" bottom")
		}
	}
	axis("η", h.LR, func(p Hyper) float64 { return p.LR })
	axis("γ", h.AdamEps, func(p Hyper) float64 { return p.AdamEps })
	axis("γ'", h.GammaPrimeRel, func(p Hyper) float64 { return p.GammaPrimeRel })
	return strings.Join(edges, ", ")
}

// tuningMarkdown renders the rows of table_tuning.csv (header first) as
// two tables: the setting chosen per (task, optimizer, ε) with its
// validation and test accuracy and whether it sits at a grid edge; then
// every grid point's validation accuracy with one column per tuning ε,
// the chosen ones in bold.
func tuningMarkdown(rows [][]string) (string, error) {
	if len(rows) == 0 {
		return "", fmt.Errorf("tuning: no header")
	}
	col := map[string]int{}
	for i, h := range rows[0] {
		col[h] = i
	}
	for _, h := range []string{"task", "optimizer", "epsilon", "sigma", "lr", "adam_eps", "gamma_prime_over_phi", "val_accuracy", "test_accuracy", "test_loss", "chosen", "grid_edge"} {
		if _, ok := col[h]; !ok {
			return "", fmt.Errorf("tuning: no %s column", h)
		}
	}
	pct := func(s string) string {
		x, err := strconv.ParseFloat(s, 64)
		if err != nil || math.IsNaN(x) {
			return "diverged"
		}
		return fmt.Sprintf("%.2f", 100*x)
	}
	second := func(r []string) string {
		switch {
		case r[col["gamma_prime_over_phi"]] != "0":
			return "γ' = " + r[col["gamma_prime_over_phi"]] + "·Φ"
		case r[col["adam_eps"]] != "0":
			return "γ = " + r[col["adam_eps"]]
		}
		return "–"
	}
	var b strings.Builder
	b.WriteString("Tuning: seed 1, validation accuracy chooses; test accuracy and loss of the same run for reference, not used to choose.\n\n")
	b.WriteString("| task | optimizer | ε | σ | η | γ or γ' | validation % | test % | test loss | grid edge |\n")
	b.WriteString("| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |\n")
	var eps []string
	type point struct{ task, algo, lr, second string }
	var points []point
	val := map[string]string{}
	for _, r := range rows[1:] {
		e := r[col["epsilon"]]
		if !slices.Contains(eps, e) {
			eps = append(eps, e)
		}
		p := point{r[col["task"]], r[col["optimizer"]], r[col["lr"]], second(r)}
		if !slices.Contains(points, p) {
			points = append(points, p)
		}
		v := pct(r[col["val_accuracy"]])
		if r[col["chosen"]] == "true" {
			v = "**" + v + "**"
			edge := r[col["grid_edge"]]
			if edge == "" {
				edge = "no"
			}
			sigma, _ := strconv.ParseFloat(r[col["sigma"]], 64)
			fmt.Fprintf(&b, "| %s | %s | %s | %.3f | %s | %s | %s | %s | %s | %s |\n", p.task, p.algo, e, sigma, p.lr, p.second,
				pct(r[col["val_accuracy"]]), pct(r[col["test_accuracy"]]), r[col["test_loss"]], edge)
		}
		val[fmt.Sprint(p, e)] = v
	}
	b.WriteString("\nValidation accuracy % of every grid point (chosen in bold):\n\n| task | optimizer | η | γ or γ' |")
	for _, e := range eps {
		fmt.Fprintf(&b, " ε = %s |", e)
	}
	b.WriteString("\n| --- | --- | --- | --- |" + strings.Repeat(" --- |", len(eps)) + "\n")
	for _, p := range points {
		fmt.Fprintf(&b, "| %s | %s | %s | %s |", p.task, p.algo, p.lr, p.second)
		for _, e := range eps {
			v, ok := val[fmt.Sprint(p, e)]
			if !ok {
				v = "–"
			}
			fmt.Fprintf(&b, " %s |", v)
		}
		b.WriteString("\n")
	}
	return b.String(), nil
}
