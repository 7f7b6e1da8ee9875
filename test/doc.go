// Package test holds rdmatap's system tests: rdmatap processes on TAP
// devices in network namespaces the tests create (they need root and skip
// with a message without it).
package test
