// Package embed sets up what both examples need: two rdmatap endpoints in
// one process on an in-memory link, and a connected QP on each.
package embed
