// Package archtest holds tests that keep weft's architecture honest: the
// import rules between layers and documentation on every package.
package archtest
