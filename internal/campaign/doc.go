// Package campaign runs randomized fault campaigns against weft: real
// weft processes (meta servers on the embedded engine or etcd, data
// servers, FUSE mounts), data and metadata workloads with models of what
// was acknowledged, and a seeded schedule of SIGKILLs, restarts on new
// ports, clean stops, pauses, partitions and slow links. At the end it
// checks every acknowledged byte and name through a fresh mount, that no
// operation failed after every fault had ended plus a bounded delay, and
// that weft fsck and weft status tell the truth. See README.md.
package campaign
