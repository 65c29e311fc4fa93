// SPDX-License-Identifier: Apache-2.0
package dev.kdn;

/** A latency histogram's summary (kdn_latency), in microseconds; {@code count} is unsigned. */
public record Latency(long count, double meanUs, double p50Us, double p90Us, double p99Us, double maxUs) {}
