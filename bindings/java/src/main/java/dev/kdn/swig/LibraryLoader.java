// SPDX-License-Identifier: Apache-2.0
package dev.kdn.swig;

import java.io.IOException;
import java.io.InputStream;
import java.io.UncheckedIOException;
import java.nio.charset.StandardCharsets;
import java.nio.file.Files;
import java.nio.file.Path;
import java.nio.file.Paths;
import java.nio.file.attribute.PosixFilePermissions;
import java.util.ArrayList;
import java.util.List;
import java.util.Locale;

/**
 * Loads kdn's JNI library (libkdn_java.so) for kdnJNI's static initializer (see kdn.i), so that
 * {@code java -cp kdn.jar} is all a program needs. In this order:
 *
 * <ol>
 *   <li>{@code -Dkdn.library.path=DIR}: the libraries in DIR (libkdn_java.so must be there; libkdn's
 *       is loaded from there first if it is). Nothing else is tried: DIR was asked for.
 *   <li>The jar's own copies under {@code dev/kdn/native/<os>-<arch>/} (the build puts them there, as
 *       sqlite-jdbc does): extracted into a new private directory (0700) under java.io.tmpdir, loaded
 *       dependency first, then deleted (the loaded copies stay mapped; nothing is left behind even if
 *       the JVM is killed).
 *   <li>{@code System.loadLibrary("kdn_java")}, from java.library.path: a jar without natives, or
 *       whose copies could not be loaded (a java.io.tmpdir mounted noexec).
 * </ol>
 *
 * <p>libkdn_java.so needs libkdn.so.1 (its DT_NEEDED). Loaded first by its full path, libkdn.so.1
 * is already in the process when libkdn_java.so is loaded, and the dynamic linker takes it by its
 * SONAME instead of searching for it: no LD_LIBRARY_PATH. LibraryLoaderTest checks that only the
 * extracted copy is mapped.
 */
final class LibraryLoader {
  private LibraryLoader() {}

  static final String PROPERTY = "kdn.library.path";
  static final String JNI_LIBRARY = "kdn_java";

  /** How the libraries were found: the first step that worked (above). */
  enum Source { LIBRARY_PATH_PROPERTY, JAR, JAVA_LIBRARY_PATH }

  private static Source source;
  private static Path directory;

  /** Loads the libraries, or throws an UnsatisfiedLinkError naming each step tried and why it failed. */
  static synchronized void load() {
    if (source != null) return;
    String dir = System.getProperty(PROPERTY);
    if (dir != null && !dir.isEmpty()) {
      loadFrom(Paths.get(dir));
      return;
    }
    List<String> tried = new ArrayList<>();
    String resources = resourceDir();
    List<String> names;
    try {
      names = jarLibraries();
    } catch (UncheckedIOException e) {
      names = List.of();  // unreadable: tried and failed
      tried.add("the copies in kdn.jar's " + resources + ": " + e.getCause());
    }
    if (names == null) {
      tried.add("the copies in kdn.jar: it has no " + resources + " (built without kdn's native libraries for this"
          + " platform)");
    } else if (!names.isEmpty()) {
      try {
        loadFromJar(resources, names);
        return;
      } catch (IOException | UncheckedIOException | UnsatisfiedLinkError e) {
        tried.add("the copies in kdn.jar's " + resources + ": " + e); // the class says what failed
      }
    }
    try {
      System.loadLibrary(JNI_LIBRARY);
      source = Source.JAVA_LIBRARY_PATH;
      return;
    } catch (UnsatisfiedLinkError e) {
      tried.add("System.loadLibrary(\"" + JNI_LIBRARY + "\"): " + e.getMessage()); // names java.library.path
      UnsatisfiedLinkError failed = new UnsatisfiedLinkError("kdn could not load its JNI library, "
          + System.mapLibraryName(JNI_LIBRARY) + ". Tried " + String.join("; then ", tried)
          + ". Name its directory with -D" + PROPERTY + "=DIR");
      failed.initCause(e);
      throw failed;
    }
  }

  /** The step that loaded the libraries; null before. */
  static synchronized Source source() {
    return source;
  }

  /**
   * The directory they were loaded from: kdn.library.path's, or the one the jar's copies were
   * extracted to (deleted since); null for java.library.path.
   */
  static synchronized Path directory() {
    return directory;
  }

  /** Where this platform's copies are in the jar: {@code dev/kdn/native/linux-x86_64/}. */
  static String resourceDir() {
    return "dev/kdn/native/" + platform() + "/";
  }

  /**
   * os-arch, as bindings/java/CMakeLists.txt names it when it packs the libraries: {@code os.name}
   * lower case without spaces ("linux"), {@code os.arch} as the kernel says it ("x86_64", not
   * Java's "amd64").
   */
  static String platform() {
    String os = System.getProperty("os.name", "").toLowerCase(Locale.ROOT).replace(" ", "");
    String arch = System.getProperty("os.arch", "").toLowerCase(Locale.ROOT);
    if (arch.equals("amd64")) arch = "x86_64";
    if (arch.equals("arm64")) arch = "aarch64";
    return os + "-" + arch;
  }

  /**
   * The jar's list of this platform's libraries ({@code libraries}, one file name a line, in load
   * order: libkdn.so.1, then libkdn_java.so); null if it has none.
   */
  static List<String> jarLibraries() {
    try (InputStream in = LibraryLoader.class.getResourceAsStream("/" + resourceDir() + "libraries")) {
      if (in == null) return null;
      List<String> names = new ArrayList<>();
      for (String line : new String(in.readAllBytes(), StandardCharsets.UTF_8).split("\n")) {
        String name = line.trim();
        if (name.isEmpty()) continue;
        if (name.contains("/") || name.startsWith(".")) {
          throw new UncheckedIOException(new IOException("a bad library name in kdn.jar: " + name));
        }
        names.add(name);
      }
      return names.isEmpty() ? null : names;
    } catch (IOException e) {
      throw new UncheckedIOException(e);
    }
  }

  private static void loadFrom(Path dir) {
    List<String> names;
    try {
      names = jarLibraries();
    } catch (UncheckedIOException e) {
      names = null;  // DIR is what was asked for: its libkdn_java.so alone
    }
    if (names == null) names = List.of(System.mapLibraryName(JNI_LIBRARY));
    Path jni = dir.resolve(names.get(names.size() - 1)).toAbsolutePath();
    if (!Files.isRegularFile(jni)) {
      throw new UnsatisfiedLinkError("kdn could not load its JNI library: -D" + PROPERTY + "=" + dir + " has no "
          + jni.getFileName());
    }
    try {
      for (String name : names.subList(0, names.size() - 1)) {
        Path p = dir.resolve(name).toAbsolutePath();
        if (Files.isRegularFile(p)) System.load(p.toString());
      }
      System.load(jni.toString());
    } catch (UnsatisfiedLinkError e) {
      UnsatisfiedLinkError failed = new UnsatisfiedLinkError("kdn could not load its JNI library from -D" + PROPERTY
          + "=" + dir + ": " + e.getMessage());
      failed.initCause(e);
      throw failed;
    }
    source = Source.LIBRARY_PATH_PROPERTY;
    directory = dir.toAbsolutePath();
  }

  private static void loadFromJar(String resources, List<String> names) throws IOException {
    Path dir = privateDirectory();
    List<Path> files = new ArrayList<>();
    try {
      for (String name : names) {
        try (InputStream in = LibraryLoader.class.getResourceAsStream("/" + resources + name)) {
          if (in == null) throw new IOException("kdn.jar lists " + name + " but has no " + resources + name);
          Path p = dir.resolve(name);
          Files.copy(in, p);
          files.add(p);
        }
      }
      for (Path p : files) System.load(p.toString());
    } finally {
      // Loaded or not, the copies are not needed on disk any more (a loaded one stays mapped).
      deleteAll(dir, files);
    }
    source = Source.JAR;
    directory = dir;
  }

  /** A new directory under java.io.tmpdir, kdn-java-<random>, that only this user can enter (0700). */
  static Path privateDirectory() throws IOException {
    try {
      return Files.createTempDirectory("kdn-java-",
          PosixFilePermissions.asFileAttribute(PosixFilePermissions.fromString("rwx------")));
    } catch (UnsupportedOperationException notPosix) {
      return Files.createTempDirectory("kdn-java-");
    }
  }

  /** Deletes the files, then the directory; what cannot be deleted now is deleted on exit. */
  private static void deleteAll(Path dir, List<Path> files) {
    List<Path> left = new ArrayList<>();
    for (Path p : files) {
      try {
        Files.deleteIfExists(p);
      } catch (IOException e) {
        left.add(p);
      }
    }
    try {
      Files.deleteIfExists(dir);
    } catch (IOException e) {
      // deleteOnExit deletes in the reverse order: the files, then the directory.
      dir.toFile().deleteOnExit();
      for (Path p : left) p.toFile().deleteOnExit();
    }
  }
}
