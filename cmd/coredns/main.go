// Command coredns is CoreDNS built with the pgcluster plugin.
package main

import (
	"fmt"
	"os"

	"github.com/coredns/caddy"
	"github.com/coredns/coredns/coremain"

	_ "github.com/pgcluster/pgcluster/plugin"
)

func main() {
	for _, a := range os.Args[1:] {
		if a == "-plugins" || a == "--plugins" {
			listPlugins()
			return
		}
	}
	coremain.Run()
}

// listPlugins prints the registered plugins by their full names (dns.NAME),
// as CoreDNS did before its caddy fork dropped the server-type prefix.
func listPlugins() {
	pl := caddy.ListPlugins()
	fmt.Println("Server types:")
	for _, s := range pl["server_types"] {
		fmt.Println("  " + s)
	}
	fmt.Println()
	fmt.Println("Other plugins:")
	for _, s := range pl["others"] {
		fmt.Println("  " + s)
	}
}
