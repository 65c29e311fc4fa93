// SPDX-License-Identifier: Apache-2.0
package dev.kdn;

/**
 * A knowledge item (kdn_document_info). {@code expiresInMs}: -1 when it never expires;
 * {@code chunksPresent}: chunks some tier holds now (fewer than {@code chunks} after evictions);
 * since 1.4, {@code hits}: chunks of it served (fetches, blends) since this version was put, and
 * {@code pinExpiresInMs}: pinned with a TTL, ms until the pin ends (-1: not pinned, or pinned until
 * unpinned).
 */
public record DocumentInfo(String docId, boolean pinned, long version, long numTokens, int chunks,
    int chunksPresent, long expiresInMs, long hits, long pinExpiresInMs) {}
