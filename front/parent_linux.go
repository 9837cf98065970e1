package main

import (
	"os"
	"syscall"
)

// watchParent asks the kernel for SIGTERM when the process that started the front dies (a
// mirror worker killed with SIGKILL): the front then drains and exits instead of serving the
// shared client socket with nobody reading its tee. False if the parent was already gone.
func watchParent() bool {
	parent := os.Getppid()
	_, _, errno := syscall.RawSyscall(syscall.SYS_PRCTL, syscall.PR_SET_PDEATHSIG, uintptr(syscall.SIGTERM), 0)
	return errno == 0 && os.Getppid() == parent
}
