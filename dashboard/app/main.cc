// SPDX-License-Identifier: Apache-2.0
// kdn-dashboard: the operator's window over a kdnd (its stats subscription),
// or over a kdnd and a workload it starts itself (--demo).
//
//   kdn-dashboard --connect 127.0.0.1:7450 --token-file ops.token [--tls-ca ca.pem] [--namespace NS ...]
//   kdn-dashboard --demo
//   kdn-dashboard --demo --in-process   (no kdnd: the workload's own runtime, watched through the C ABI)
//   kdn-dashboard --demo --screenshot out.png --after-ms 8000 --check --size 1280x800
//   kdn-dashboard --demo --palette dark   (the dark look without a dark desktop, e.g. under Xvfb)
//
// --screenshot grabs the window after --after-ms and exits; with --check the
// exit status says whether the models showed a non-zero hit rate, occupancy
// and TTFT saved (the values are printed; values not there yet are waited
// for, at most --check-wait-ms more), and whether the window showed them
// whole: no label, group title or table column cut at this size, time axes
// with labels on both charts, and only faults highlighted
// (MainWindow::layoutProblems, highlightProblems). The hit rate is the
// overall one (the source's tokens found / tokens asked for).
#include <signal.h>

#include <QApplication>
#include <QElapsedTimer>
#include <QEvent>
#include <QMetaObject>
#include <QPalette>
#include <QPixmap>
#include <QStyle>
#include <QStyleFactory>
#include <QTimer>

#include <CLI/CLI.hpp>

#include <cstdio>
#include <cstdlib>
#include <memory>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "demo.h"
#include "main_window.h"
#include "node_source.h"
#include "runtime_source.h"
#include "token_file.h"

namespace {

using kdn::dash::Demo;
using kdn::dash::MainWindow;

struct Size {
  int width = 1280, height = 800;
};

// "1280x800" -> a size between 320x240 and 7680x4320.
std::optional<Size> ParseSize(const std::string& text) {
  const size_t x = text.find('x');
  if (x == std::string::npos) return std::nullopt;
  try {
    size_t used = 0;
    Size s;
    s.width = std::stoi(text.substr(0, x), &used);
    if (used != x) return std::nullopt;
    const std::string h = text.substr(x + 1);
    s.height = std::stoi(h, &used);
    if (used != h.size()) return std::nullopt;
    if (s.width < 320 || s.width > 7680 || s.height < 240 || s.height > 4320) return std::nullopt;
    return s;
  } catch (const std::exception&) {
    return std::nullopt;
  }
}

// --palette dark: a dark palette for every role the views read (window,
// base, text, the bevels, highlights, placeholders), disabled text dimmed.
QPalette DarkPalette() {
  const QColor window(0x2b, 0x2d, 0x30), base(0x1e, 0x1f, 0x22), alternate(0x33, 0x35, 0x39);
  const QColor text(0xe3, 0xe5, 0xe8), dim(0x8a, 0x8e, 0x94), highlight(0x3d, 0x8e, 0xe0);
  QPalette p;
  p.setColor(QPalette::Window, window);
  p.setColor(QPalette::WindowText, text);
  p.setColor(QPalette::Base, base);
  p.setColor(QPalette::AlternateBase, alternate);
  p.setColor(QPalette::ToolTipBase, alternate);
  p.setColor(QPalette::ToolTipText, text);
  p.setColor(QPalette::PlaceholderText, dim);
  p.setColor(QPalette::Text, text);
  p.setColor(QPalette::Button, alternate);
  p.setColor(QPalette::ButtonText, text);
  p.setColor(QPalette::BrightText, QColor(0xff, 0x6b, 0x6b));
  p.setColor(QPalette::Light, QColor(0x4a, 0x4d, 0x52));
  p.setColor(QPalette::Midlight, QColor(0x3e, 0x41, 0x45));
  p.setColor(QPalette::Mid, QColor(0x5c, 0x60, 0x66));
  p.setColor(QPalette::Dark, QColor(0x18, 0x19, 0x1b));
  p.setColor(QPalette::Shadow, QColor(0x0c, 0x0c, 0x0d));
  p.setColor(QPalette::Highlight, highlight);
  p.setColor(QPalette::HighlightedText, Qt::white);
  p.setColor(QPalette::Link, QColor(0x6c, 0xb0, 0xf5));
  p.setColor(QPalette::LinkVisited, QColor(0xb3, 0x8d, 0xe6));
  for (QPalette::ColorRole role : {QPalette::WindowText, QPalette::Text, QPalette::ButtonText}) {
    p.setColor(QPalette::Disabled, role, dim);
  }
  return p;
}

// SIGINT and SIGTERM close the window (so the demo's kdnd and its directory
// are cleaned up): blocked in every thread, taken by one that asks the event
// loop to quit.
void QuitOnSignals() {
  sigset_t set;
  sigemptyset(&set);
  sigaddset(&set, SIGINT);
  sigaddset(&set, SIGTERM);
  pthread_sigmask(SIG_BLOCK, &set, nullptr);
  std::thread([set] {
    int sig = 0;
    if (sigwait(&set, &sig) == 0) {
      QMetaObject::invokeMethod(qApp, [sig] { QCoreApplication::exit(128 + sig); }, Qt::QueuedConnection);
    }
  }).detach();
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App cli{"kdn-dashboard: hit rates, tier occupancy and TTFT saved of a kdnd, live"};
  kdn::dash::NodeSourceOptions node;
  std::string token_file, screenshot, size_text = "1280x800", palette = "system";
  bool demo = false, check = false;
  int after_ms = 8000, check_wait_ms = 60000;
  kdn::dash::DemoOptions demo_options;
  auto* connect = cli.add_option("--connect", node.address, "the kdnd to watch: HOST:PORT or unix:/path");
  cli.add_option("--token-file", token_file, "a file holding a token with stats = true (mode 600)")
      ->check(CLI::ExistingFile);
  cli.add_option("--tls-ca", node.tls_ca_file, "TLS: the PEM certificate(s) to check the node's against")
      ->check(CLI::ExistingFile);
  cli.add_option("--tls-name", node.tls_server_name, "TLS: the name the node's certificate carries (default: the host)");
  cli.add_option("--namespace", node.namespaces, "namespaces whose knowledge items are listed (the token must grant them)");
  cli.add_option("--interval-ms", node.interval_ms, "how often kdnd pushes its statistics")->check(CLI::Range(50, 60000));
  auto* demo_flag = cli.add_flag("--demo", demo, "start a kdnd and a workload (the reference engine) in this process");
  cli.add_flag("--in-process", demo_options.in_process,
               "--demo without a kdnd: the workload's runtime has the tiers, watched through its C ABI")
      ->needs(demo_flag);
  cli.add_option("--texts", demo_options.texts, "--demo: the documents, paragraphs separated by blank lines")
      ->check(CLI::ExistingFile);
  auto* shot = cli.add_option("--screenshot", screenshot, "grab the window into this PNG after --after-ms, then exit");
  cli.add_option("--after-ms", after_ms, "when to grab the screenshot")->check(CLI::Range(0, 3600000));
  cli.add_flag("--check", check, "with --screenshot: fail unless hit rate, occupancy and TTFT saved are non-zero")
      ->needs(shot);
  cli.add_option("--check-wait-ms", check_wait_ms, "with --check: how much longer to wait for the values")
      ->check(CLI::Range(0, 3600000));
  cli.add_option("--size", size_text, "the window's size, WxH");
  cli.add_option("--palette", palette, "colours: the desktop's (system), or dark or light whatever the desktop")
      ->check(CLI::IsMember({"system", "dark", "light"}));
  connect->excludes(demo_flag);
  CLI11_PARSE(cli, argc, argv);

  const std::optional<Size> size = ParseSize(size_text);
  if (!size) {
    std::fprintf(stderr, "kdn-dashboard: --size %s: give WIDTHxHEIGHT, from 320x240 to 7680x4320\n", size_text.c_str());
    return 2;
  }
  if (!demo && node.address.empty()) {
    std::fprintf(stderr, "kdn-dashboard: give --connect HOST:PORT --token-file F (a kdnd), or --demo\n");
    return 2;
  }
  if (!demo) {
    if (token_file.empty()) {
      std::fprintf(stderr, "kdn-dashboard: --connect needs --token-file (a token with stats = true)\n");
      return 2;
    }
    std::string error;
    if (!kdn::dash::ReadTokenFile(token_file, &node.token, &error)) {
      std::fprintf(stderr, "kdn-dashboard: %s\n", error.c_str());
      return 2;
    }
  }
  if (std::getenv("DISPLAY") == nullptr && std::getenv("WAYLAND_DISPLAY") == nullptr &&
      std::getenv("QT_QPA_PLATFORM") == nullptr) {
    std::fprintf(stderr, "kdn-dashboard: no display (DISPLAY, WAYLAND_DISPLAY or QT_QPA_PLATFORM); "
                         "run it under a desktop, or xvfb-run for a screenshot\n");
    return 2;
  }

  QuitOnSignals();  // before any thread starts, so all inherit the mask
  QApplication app(argc, argv);
  qRegisterMetaType<kdn::dash::Snapshot>();
  if (palette != "system") {
    // Fusion draws every widget from the palette (a desktop's style may not).
    QApplication::setStyle(QStyleFactory::create(QStringLiteral("Fusion")));
    QApplication::setPalette(palette == "dark" ? DarkPalette() : QApplication::style()->standardPalette());
  }

  std::unique_ptr<Demo> running;
  if (demo) {
    std::string error;
    running = Demo::Start(demo_options, &error);
    if (!running) {
      std::fprintf(stderr, "kdn-dashboard --demo: %s\n", error.c_str());
      return 2;
    }
    std::printf("kdn-dashboard --demo: %s\n", running->describe().c_str());
    std::fflush(stdout);
    node.address = running->address();
    node.token = running->stats_token();
    node.namespaces = {Demo::knowledge_namespace()};
  }

  // Destroyed (stopped) before the demo: a RuntimeSource borrows its runtime.
  std::unique_ptr<kdn::dash::Source> source;
  if (running && running->runtime() != nullptr) {
    kdn::dash::RuntimeSourceOptions watch;
    watch.model = running->model();
    watch.namespaces = {Demo::knowledge_namespace()};
    source = std::make_unique<kdn::dash::RuntimeSource>(running->runtime(), watch);
  } else {
    source = std::make_unique<kdn::dash::NodeSource>(node);
  }
  MainWindow window(source.get());
  window.resize(size->width, size->height);
  window.show();

  // --check: the values the views show must be non-zero. A slow machine
  // may need longer than --after-ms for the first hits: the grab then waits
  // for the models' next readings, at most --check-wait-ms more.
  const auto values_ok = [&window] {
    const kdn::dash::Headline h = window.headline();
    return h.cumulative_hit_rate > 0 && h.used_bytes > 0 && h.ttft_saved_ms > 0;
  };
  bool armed = false, done = false;
  QElapsedTimer since_armed;
  const auto finish = [&] {
    if (done) return;
    done = true;
    // What the last readings changed is laid out before it is grabbed and checked.
    QCoreApplication::sendPostedEvents(nullptr, QEvent::LayoutRequest);
    QCoreApplication::processEvents();
    const bool saved = window.grab().save(QString::fromStdString(screenshot), "PNG");
    int code = saved ? 0 : 1;
    if (!saved) std::fprintf(stderr, "kdn-dashboard: cannot write %s\n", screenshot.c_str());
    const kdn::dash::Headline h = window.headline();
    std::printf("kdn-dashboard: %s (%dx%d) after %d + %lld ms; %.0f readings: hit rate since start %.4f, "
                "best tier (%s) hit rate %.4f, used %.0f bytes, TTFT saved %.3f ms\n",
                screenshot.c_str(), window.width(), window.height(), after_ms,
                static_cast<long long>(since_armed.elapsed()), h.readings, h.cumulative_hit_rate,
                h.tier.toStdString().c_str(), h.tier_hit_rate, h.used_bytes, h.ttft_saved_ms);
    if (running) {
      const kdn::dash::DemoCounters& c = running->counters();
      std::printf("kdn-dashboard: the workload made %llu requests (%llu stores, %llu RAG blends, %llu errors)\n",
                  static_cast<unsigned long long>(c.requests.load()), static_cast<unsigned long long>(c.stores.load()),
                  static_cast<unsigned long long>(c.blends.load()), static_cast<unsigned long long>(c.errors.load()));
    }
    if (check) {
      if (h.cumulative_hit_rate < 0) {
        std::printf("kdn-dashboard: the source reports no requested tokens (overall hit rate unknown): "
                    "the tiers' hit rate was checked instead\n");
      }
      const bool ok = values_ok();
      std::printf("kdn-dashboard: check %s\n",
                  ok ? "passed: hit rate, occupancy and TTFT saved are non-zero"
                     : "FAILED: hit rate, occupancy and TTFT saved must all be non-zero");
      if (!ok) code = 1;
      int routine_moved = 0;
      QStringList layout = window.layoutProblems();
      // At the size asked for: a window whose parts need more room grows past
      // it (under Xvfb, without a window manager to hold it), and would pass
      // at a size nobody asked about.
      if (window.width() != size->width || window.height() != size->height) {
        layout << QStringLiteral("the window is %1x%2, not %3x%4: its parts need at least %5x%6")
                      .arg(window.width()).arg(window.height()).arg(size->width).arg(size->height)
                      .arg(window.minimumSizeHint().width()).arg(window.minimumSizeHint().height());
      }
      const QStringList highlights = window.highlightProblems(&routine_moved);
      for (const QString& p : layout) {
        std::printf("kdn-dashboard: cut at %dx%d: %s\n", window.width(), window.height(), p.toUtf8().constData());
      }
      for (const QString& p : highlights) std::printf("kdn-dashboard: highlight: %s\n", p.toUtf8().constData());
      std::printf("kdn-dashboard: check %s: every label, title and table column whole at %dx%d, time axes "
                  "with labels, only faults highlighted (%d routine cells moved, drawn plainly)\n",
                  layout.isEmpty() && highlights.isEmpty() ? "passed" : "FAILED", window.width(), window.height(),
                  routine_moved);
      if (!layout.isEmpty() || !highlights.isEmpty()) code = 1;
    }
    std::fflush(stdout);
    QCoreApplication::exit(code);
  };
  if (!screenshot.empty()) {
    QTimer::singleShot(after_ms, &window, [&] {
      armed = true;
      since_armed.start();
      if (!check || values_ok()) return finish();
      QTimer::singleShot(check_wait_ms, &window, finish);
    });
    QObject::connect(&window.history(), &QAbstractItemModel::rowsInserted, &window, [&] {
      if (armed && values_ok()) finish();
    });
  }
  return app.exec();
}
