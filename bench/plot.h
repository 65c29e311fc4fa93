// SPDX-License-Identifier: Apache-2.0
// PNG plots for the benchmarks, drawn by gnuplot (Debian: gnuplot-nox) run
// as a subprocess. A missing or failing gnuplot is a warning, never an error:
// the JSON records are the benchmark's result, the plot a view of them.
// Thread-safety: plain functions.
#pragma once

#include <string>

namespace kdn::bench {

// A double-quoted gnuplot string of `s` (newlines become line breaks).
std::string GnuplotQuote(const std::string& s);

// Writes `png` from a gnuplot script body (data blocks, settings and plot
// commands; the terminal and size are set here). `tool` prefixes warnings
// ("kdn bench codec"). True when the PNG was written.
bool DrawPng(const std::string& png, const std::string& body, const std::string& tool);

}  // namespace kdn::bench
