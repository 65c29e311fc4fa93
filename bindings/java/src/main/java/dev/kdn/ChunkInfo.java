// SPDX-License-Identifier: Apache-2.0
package dev.kdn;

/**
 * The chunk an {@link Editor} is given (kdn_chunk_info): its shape, and the position of its first
 * token (-1: position-free, a knowledge item's).
 */
public record ChunkInfo(int numLayers, int numKvHeads, int headDim, int numTokens, DType dtype, long firstPosition) {}
