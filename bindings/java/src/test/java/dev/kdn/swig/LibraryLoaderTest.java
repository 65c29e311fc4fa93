// SPDX-License-Identifier: Apache-2.0
package dev.kdn.swig;

import static org.junit.jupiter.api.Assertions.*;

import dev.kdn.Kdn;
import java.io.IOException;
import java.nio.file.Files;
import java.nio.file.Path;
import java.nio.file.Paths;
import java.nio.file.attribute.PosixFilePermissions;
import java.util.List;
import java.util.Map;
import java.util.Set;
import java.util.TreeMap;
import java.util.TreeSet;
import org.junit.jupiter.api.Test;
import org.junit.jupiter.api.condition.DisabledIfSystemProperty;
import org.junit.jupiter.api.condition.EnabledIfSystemProperty;
import org.junit.jupiter.api.io.TempDir;

/**
 * How kdn's JNI library was found. bindings/java/CMakeLists.txt runs this class once for each way
 * and says which with -Dkdn.test.loaded.from (none: from kdn.jar); no run sets LD_LIBRARY_PATH.
 */
class LibraryLoaderTest {
  private static final String MODE = "kdn.test.loaded.from";

  /**
   * The files this process maps for each of {@code names}: those of that name or a longer one
   * (the build tree's libkdn.so.1 is a link, mapped as libkdn.so.1.x.y).
   */
  private static Map<String, Set<String>> mapped(List<String> names) throws IOException {
    Map<String, Set<String>> out = new TreeMap<>();
    for (String line : Files.readAllLines(Paths.get("/proc/self/maps"))) {
      String[] f = line.trim().split("\\s+", 6);
      if (f.length < 6 || !f[5].startsWith("/")) continue;
      String path = f[5].endsWith(" (deleted)") ? f[5].substring(0, f[5].length() - " (deleted)".length()) : f[5];
      String name = Paths.get(path).getFileName().toString();
      for (String n : names) {
        if (name.equals(n) || name.startsWith(n + ".")) out.computeIfAbsent(n, k -> new TreeSet<>()).add(path);
      }
    }
    return out;
  }

  /** Each library of the jar's list (or libkdn_java.so alone) is mapped once, from {@code dir}. */
  private static void assertMappedFrom(Path dir, List<String> names) throws IOException {
    Map<String, Set<String>> m = mapped(names);
    for (String name : names) {
      assertEquals(Set.of(dir.resolve(name).toString()), m.get(name), name + " mapped from " + m.get(name));
    }
  }

  @Test
  @DisabledIfSystemProperty(named = MODE, matches = ".+")
  void testFromTheJar() throws IOException {
    assertFalse(Kdn.version().isEmpty()); // a call into libkdn through libkdn_java
    assertEquals(LibraryLoader.Source.JAR, LibraryLoader.source());
    List<String> names = LibraryLoader.jarLibraries();
    assertEquals(2, names.size(), names.toString());
    assertTrue(names.get(0).matches("libkdn\\.so\\.\\d+"), names.toString()); // its SONAME
    assertEquals("libkdn_java.so", names.get(1));
    Path dir = LibraryLoader.directory();
    assertEquals(Paths.get(System.getProperty("java.io.tmpdir")).toAbsolutePath(), dir.getParent().toAbsolutePath());
    assertTrue(dir.getFileName().toString().startsWith("kdn-java-"), dir.toString());
    assertFalse(Files.exists(dir), dir + " is left behind");
    // Only the extracted copies: libkdn_java.so's DT_NEEDED libkdn.so.1 was taken by its SONAME
    // from the copy loaded first, not from the build tree its rpath names.
    assertMappedFrom(dir, names);
  }

  @Test
  @DisabledIfSystemProperty(named = MODE, matches = ".+")
  void testPrivateDirectory() throws IOException {
    Path a = LibraryLoader.privateDirectory();
    Path b = LibraryLoader.privateDirectory();
    try {
      assertNotEquals(a, b);
      assertEquals("rwx------", PosixFilePermissions.toString(Files.getPosixFilePermissions(a)));
      assertEquals("rwx------", PosixFilePermissions.toString(Files.getPosixFilePermissions(b)));
    } finally {
      Files.delete(a);
      Files.delete(b);
    }
  }

  @Test
  @DisabledIfSystemProperty(named = MODE, matches = ".+")
  void testPlatform() {
    assertEquals("dev/kdn/native/" + LibraryLoader.platform() + "/", LibraryLoader.resourceDir());
    if (System.getProperty("os.name").equals("Linux") && System.getProperty("os.arch").equals("amd64")) {
      assertEquals("linux-x86_64", LibraryLoader.platform());
    }
  }

  @Test
  @EnabledIfSystemProperty(named = MODE, matches = "LIBRARY_PATH_PROPERTY")
  void testFromTheProperty() throws IOException {
    assertFalse(Kdn.version().isEmpty());
    assertEquals(LibraryLoader.Source.LIBRARY_PATH_PROPERTY, LibraryLoader.source());
    Path dir = Paths.get(System.getProperty(LibraryLoader.PROPERTY)).toAbsolutePath();
    assertEquals(dir, LibraryLoader.directory());
    assertMappedFrom(dir, List.of("libkdn_java.so"));
  }

  @Test
  @EnabledIfSystemProperty(named = MODE, matches = "JAVA_LIBRARY_PATH")
  void testFromJavaLibraryPath() throws IOException {
    // Run with a classpath without natives, and with kdn.jar but a java.io.tmpdir to which the
    // copies cannot be extracted.
    assertFalse(Kdn.version().isEmpty());
    assertEquals(LibraryLoader.Source.JAVA_LIBRARY_PATH, LibraryLoader.source());
    assertNull(LibraryLoader.directory());
    assertMappedFrom(Paths.get(System.getProperty("java.library.path")).toAbsolutePath(), List.of("libkdn_java.so"));
  }

  @Test
  @EnabledIfSystemProperty(named = MODE, matches = "NONE")
  void testNothingToLoad(@TempDir Path empty) {
    assertNull(LibraryLoader.jarLibraries(), "this run's classpath has no natives");
    UnsatisfiedLinkError e = assertThrows(UnsatisfiedLinkError.class, LibraryLoader::load);
    String m = e.getMessage();
    assertTrue(m.contains("libkdn_java.so"), m);
    assertTrue(m.contains("the copies in kdn.jar: it has no dev/kdn/native/" + LibraryLoader.platform() + "/"), m);
    assertTrue(m.contains("then System.loadLibrary(\"kdn_java\"): "), m);
    assertTrue(m.contains("-Dkdn.library.path=DIR"), m);
    assertNull(LibraryLoader.source());

    // A directory asked for is the only one tried, and named.
    System.setProperty(LibraryLoader.PROPERTY, empty.toString());
    try {
      e = assertThrows(UnsatisfiedLinkError.class, LibraryLoader::load);
      assertEquals("kdn could not load its JNI library: -Dkdn.library.path=" + empty + " has no libkdn_java.so",
          e.getMessage());
    } finally {
      System.clearProperty(LibraryLoader.PROPERTY);
    }
    assertNull(LibraryLoader.source());
  }
}
