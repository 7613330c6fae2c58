// Package weftv1 holds weft's wire protocol: the Meta service (namespace,
// sessions, cluster manager) and the Data service (chunks on storage
// targets), generated from meta.proto and data.proto. It imports nothing of
// weft, so every part can depend on it.
package weftv1

// PiecesOffset is WriteChunkRequest.Offset of a write of several pieces
// (WriteChunkRequest.PieceOffsets): past any chunk, so that a server that
// does not know pieces refuses such a write.
const PiecesOffset = 1 << 62
