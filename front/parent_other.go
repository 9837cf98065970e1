//go:build !linux

package main

// watchParent: only Linux tells a process of its parent's death; elsewhere the mirror stops
// the front itself.
func watchParent() bool { return true }
