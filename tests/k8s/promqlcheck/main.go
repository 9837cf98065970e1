// promqlcheck parses PromQL expressions, one per line on stdin, with Prometheus's own parser
// and prints each that does not parse with the error; exit status 1 if any failed.
// Built by tests/k8s/k8s_tools.py into var/tools/bin; used on the dashboard and the alert rules.
package main

import (
	"bufio"
	"fmt"
	"os"

	"github.com/prometheus/prometheus/promql/parser"
)

func main() {
	sc := bufio.NewScanner(os.Stdin)
	sc.Buffer(make([]byte, 1<<20), 1<<20)
	p := parser.NewParser(parser.Options{})
	bad := 0
	for sc.Scan() {
		if _, err := p.ParseExpr(sc.Text()); err != nil {
			fmt.Printf("%s\n\t%v\n", sc.Text(), err)
			bad++
		}
	}
	if bad > 0 {
		os.Exit(1)
	}
}
