// SPDX-License-Identifier: Apache-2.0
package dev.kdn;

/** Tokens [begin, end) of a request (unsigned). */
public record TokenRange(long begin, long end) {}
