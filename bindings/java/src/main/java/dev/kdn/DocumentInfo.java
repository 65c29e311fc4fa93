package dev.kdn;

/**
 * A knowledge item (kdn_document_info). {@code expiresInMs}: -1 when it never expires;
 * {@code chunksPresent}: chunks some tier holds now (fewer than {@code chunks} after evictions).
 */
public record DocumentInfo(String docId, boolean pinned, long version, long numTokens, int chunks,
    int chunksPresent, long expiresInMs) {}
