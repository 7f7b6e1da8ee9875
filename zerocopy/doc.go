// Package zerocopy is rdmatap's memory layer: registered memory (page-aligned,
// optionally shared through a memfd), scatter-gather lists, and the fused
// copy+CRC32c kernel that lets the data path touch each payload byte once.
package zerocopy
