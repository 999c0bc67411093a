// Package threadtime reads the CPU time of the calling thread, for the
// benchmarks that time how long a lock is held: timing a section of code
// by it leaves out the time the machine gave to other work meanwhile,
// which on a shared machine is most of a long section's wall time.
package threadtime
