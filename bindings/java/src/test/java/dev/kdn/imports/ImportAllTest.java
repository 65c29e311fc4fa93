// SPDX-License-Identifier: Apache-2.0
// A user's file: dev.kdn imported on demand next to the JDK packages programs import so. Were a
// public name of dev.kdn also one of theirs (dev.kdn.Runtime and java.lang.Runtime once), its
// simple name below would be ambiguous and javac would refuse this file (the test_classes ctest).
// Outside package dev.kdn on purpose: inside it, dev.kdn's names need no import.
package dev.kdn.imports;

import static org.junit.jupiter.api.Assertions.*;

import dev.kdn.*;
import java.io.*;
import java.lang.reflect.Modifier;
import java.net.URISyntaxException;
import java.nio.file.*;
import java.util.*;
import java.util.concurrent.*;
import java.util.function.*;
import java.util.jar.JarFile;
import java.util.stream.*;
import org.junit.jupiter.api.Test;

class ImportAllTest {
  /** Packages imported on demand often enough that a dev.kdn name must not also be theirs. */
  static final List<String> JDK_PACKAGES = List.of("java.lang", "java.util", "java.util.concurrent",
      "java.util.function", "java.util.stream", "java.io", "java.nio", "java.nio.file", "java.time", "java.net",
      "java.math");

  @Test
  void testKdnRuntimeNextToJavaLangRuntime() {
    // java.lang.Runtime by its simple name, as every program may use it.
    int processors = Runtime.getRuntime().availableProcessors();
    assertTrue(processors > 0);
    RuntimeOptions options = RuntimeOptions.builder().chunkTokens(16).tier(TierConfig.host(1 << 20)).build();
    ModelSpec spec = ModelSpec.builder().layers(1).kvHeads(1).headDim(4).dtype(DType.F32).fingerprint("imports")
        .build();
    try (KdnRuntime rt = KdnRuntime.create(options); Model model = rt.createModel(spec)) {
      assertSame(rt, model.runtime());
      assertEquals(0, model.lookup("ns", Request.ofTokens(new int[] {1, 2, 3})).cachedTokens());
      assertEquals(1, rt.stats().lookups());
    }
  }

  @Test
  void testKdnExceptionsNextToConcurrents() {
    // java.util.concurrent's exceptions by their simple names.
    assertThrows(TimeoutException.class, () -> new CompletableFuture<Void>().get(1, TimeUnit.MILLISECONDS));
    CompletableFuture<Void> cancelled = new CompletableFuture<>();
    cancelled.cancel(false);
    assertThrows(CancellationException.class, cancelled::join);
    // kdn's, in their families.
    KdnException timeout = KdnException.of(Status.TIMEOUT.code(), "late", 0);
    assertInstanceOf(KdnTimeoutException.class, timeout);
    assertInstanceOf(RetryableException.class, timeout);
    assertEquals(Status.TIMEOUT, timeout.status());
    KdnException cancel = KdnException.of(Status.CANCELLED.code(), "stop", 0);
    assertInstanceOf(KdnCancelledException.class, cancel);
    assertEquals(Status.CANCELLED, cancel.status());
  }

  /** The public classes of dev.kdn in kdn.jar (or the classes folder this run uses). */
  static List<String> kdnPublicNames() throws IOException, URISyntaxException, ClassNotFoundException {
    Path where = Paths.get(KdnRuntime.class.getProtectionDomain().getCodeSource().getLocation().toURI());
    List<String> files = new ArrayList<>();
    if (Files.isDirectory(where)) {
      try (Stream<Path> s = Files.list(where.resolve("dev/kdn"))) {
        s.forEach(p -> files.add(p.getFileName().toString()));
      }
    } else {
      try (JarFile jar = new JarFile(where.toFile())) {
        jar.stream().map(e -> e.getName()).filter(n -> n.matches("dev/kdn/[^/]+"))
            .forEach(n -> files.add(n.substring("dev/kdn/".length())));
      }
    }
    List<String> names = new ArrayList<>();
    for (String f : files) {
      if (!f.endsWith(".class") || f.contains("$")) continue;
      String name = f.substring(0, f.length() - ".class".length());
      Class<?> c = Class.forName("dev.kdn." + name, false, KdnRuntime.class.getClassLoader());
      if (Modifier.isPublic(c.getModifiers())) names.add(name);
    }
    return names;
  }

  /** The public classes of JDK_PACKAGES named {@code simpleName}. */
  static List<String> jdkClasses(String simpleName) {
    List<String> out = new ArrayList<>();
    for (String pkg : JDK_PACKAGES) {
      try {
        Class<?> c = Class.forName(pkg + "." + simpleName, false, ClassLoader.getPlatformClassLoader());
        if (Modifier.isPublic(c.getModifiers())) out.add(c.getName());
      } catch (ClassNotFoundException none) {
        // not a name of that package
      }
    }
    return out;
  }

  @Test
  void testNoNameOfTheJdk() throws Exception {
    assertEquals(List.of("java.lang.Runtime"), jdkClasses("Runtime")); // the check finds one
    assertEquals(List.of("java.util.concurrent.TimeoutException"), jdkClasses("TimeoutException"));
    List<String> names = kdnPublicNames();
    assertTrue(names.containsAll(List.of("KdnRuntime", "Model", "KdnTimeoutException", "KdnCancelledException")),
        names.toString());
    Map<String, List<String>> collisions = new TreeMap<>();
    for (String name : names) {
      List<String> jdk = jdkClasses(name);
      if (!jdk.isEmpty()) collisions.put("dev.kdn." + name, jdk);
    }
    assertEquals(Map.of(), collisions);
  }
}
