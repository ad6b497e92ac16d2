/* emu_translate: a kernels/cuda .cu file as C++ for the CUDA-on-CPU test emulator
 * (tests/cuda/emu/README.md).
 *
 *   emu_translate IN.cu OUT.cpp
 *
 * OUT is IN with `#include "cuda_emu.h"` and `#line 1 "IN"` in front (so diagnostics and
 * __FILE__ / __LINE__ name the original) and, outside comments and literals, two rewrites that
 * keep every line where it was:
 *   K<<<g, b, s, st>>>(args)   ->  ::cuemu::launch_at(__FILE__, __LINE__, __func__, K, g, b, s, st)(args)
 *       K: an identifier (macro pastes with ## and qualifiers with :: included), possibly with
 *       template arguments <...>;
 *   extern __shared__ T name[];  ->  static T *const name = ::cuemu::dyn_smem();
 * Anything else is left to cuda_emu.h's macros. An unreadable launch is an error
 * ("IN:line: ..."), exit 1. */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <algorithm>
#include <string>
#include <vector>

namespace {

std::string src, path;

struct Edit {
  size_t pos, len;
  std::string text;
};
std::vector<Edit> edits;

int line_of(size_t pos) { return 1 + (int)std::count(src.begin(), src.begin() + (long)pos, '\n'); }

[[noreturn]] void fail(size_t pos, const char *msg) {
  fprintf(stderr, "%s:%d: emu_translate: %s\n", path.c_str(), line_of(pos), msg);
  exit(1);
}

bool ident_char(char c) { return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '_'; }
bool space_char(char c) { return c == ' ' || c == '\t' || c == '\n' || c == '\r' || c == '\\'; }

/* the end of the comment or literal starting at i, or i when there is none */
size_t skip_opaque(size_t i) {
  size_t n = src.size();
  if (src.compare(i, 2, "//") == 0) {
    while (i < n && src[i] != '\n') i += src[i] == '\\' ? 2 : 1; /* a \ continues a // comment */
    return i;
  }
  if (src.compare(i, 2, "/*") == 0) {
    size_t e = src.find("*/", i + 2);
    return e == std::string::npos ? n : e + 2;
  }
  if (src[i] == '"' || src[i] == '\'') {
    char q = src[i];
    if (q == '\'' && i > 0 && ident_char(src[i - 1]) && src[i - 1] >= '0' && src[i - 1] <= '9')
      return i; /* a digit separator 1'000 */
    for (i++; i < n && src[i] != q; i++)
      if (src[i] == '\\') i++;
    return i + 1;
  }
  return i;
}

/* the position of the >>> closing the <<< at open, at bracket depth 0 */
size_t closing(size_t open) {
  int depth = 0;
  for (size_t i = open + 3; i < src.size();) {
    size_t j = skip_opaque(i);
    if (j != i) {
      i = j;
      continue;
    }
    char c = src[i];
    if (c == '(' || c == '[' || c == '{') depth++;
    else if (c == ')' || c == ']' || c == '}') {
      if (--depth < 0) break;
    } else if (depth == 0 && src.compare(i, 3, ">>>") == 0) return i;
    else if (c == ';') break;
    i++;
  }
  fail(open, "no >>> closes this <<<");
}

/* where the kernel expression before the <<< at open starts */
size_t kernel_start(size_t open) {
  size_t i = open;
  while (i > 0 && space_char(src[i - 1])) i--;
  if (i > 0 && src[i - 1] == '>') { /* template arguments */
    int depth = 0;
    while (i > 0) {
      char c = src[--i];
      if (c == '>') depth++;
      else if (c == '<' && --depth == 0) break;
    }
    if (depth != 0) fail(open, "unbalanced template arguments before <<<");
    while (i > 0 && space_char(src[i - 1])) i--;
  }
  size_t end = i;
  while (i > 0 && (ident_char(src[i - 1]) || src[i - 1] == '#' || src[i - 1] == ':')) i--;
  if (i == end) fail(open, "no kernel name before <<<");
  return i;
}

void launch(size_t open) {
  size_t start = kernel_start(open), close = closing(open);
  edits.push_back({start, 0, "::cuemu::launch_at(__FILE__, __LINE__, __func__, "});
  edits.push_back({open, 3, ", "});
  edits.push_back({close, 3, ")"});
}

/* `extern __shared__ ... name[];` starting at i (the e of extern) */
void dynamic_shared(size_t i, size_t after) {
  size_t semi = src.find(';', after);
  if (semi == std::string::npos) fail(i, "extern __shared__ without ;");
  size_t br = src.rfind('[', semi);
  if (br == std::string::npos || br < after) fail(i, "extern __shared__ needs the form `extern __shared__ T name[];`");
  size_t k = br + 1;
  while (k < semi && space_char(src[k])) k++;
  if (src[k] != ']') fail(i, "extern __shared__ needs the form `extern __shared__ T name[];`");
  size_t name = br;
  while (name > after && space_char(src[name - 1])) name--;
  size_t name_end = name;
  while (name > after && ident_char(src[name - 1])) name--;
  if (name == name_end) fail(i, "no name in extern __shared__");
  edits.push_back({i, after - i, "static"});
  edits.push_back({name, 0, "*const "});
  edits.push_back({name_end, k + 1 - name_end, " = ::cuemu::dyn_smem()"});
}

bool word_at(size_t i, const char *w) {
  size_t n = strlen(w);
  return src.compare(i, n, w) == 0 && (i == 0 || !ident_char(src[i - 1])) &&
         (i + n >= src.size() || !ident_char(src[i + n]));
}

} // namespace

int main(int argc, char **argv) {
  if (argc != 3) {
    fprintf(stderr, "usage: emu_translate IN.cu OUT.cpp\n");
    return 2;
  }
  path = argv[1];
  FILE *f = fopen(argv[1], "rb");
  if (!f) {
    fprintf(stderr, "%s: cannot read: %s\n", argv[1], strerror(errno));
    return 1;
  }
  char buf[65536];
  size_t got;
  while ((got = fread(buf, 1, sizeof buf, f)) > 0) src.append(buf, got);
  fclose(f);

  for (size_t i = 0; i < src.size();) {
    size_t j = skip_opaque(i);
    if (j != i) {
      i = j;
      continue;
    }
    if (src.compare(i, 3, "<<<") == 0) {
      launch(i);
      i += 3;
      continue;
    }
    if (word_at(i, "extern")) {
      size_t k = i + 6;
      while (k < src.size() && space_char(src[k])) k++;
      if (word_at(k, "__shared__")) {
        dynamic_shared(i, k + 10);
        i = k + 10;
        continue;
      }
    }
    i++;
  }

  std::sort(edits.begin(), edits.end(), [](const Edit &a, const Edit &b) { return a.pos < b.pos; });
  std::string out = "#include \"cuda_emu.h\"\n#line 1 \"" + path + "\"\n";
  size_t at = 0;
  for (const Edit &e : edits) {
    if (e.pos < at) fail(e.pos, "overlapping rewrites");
    out.append(src, at, e.pos - at);
    out += e.text;
    at = e.pos + e.len;
  }
  out.append(src, at, std::string::npos);

  FILE *o = fopen(argv[2], "wb");
  if (!o || fwrite(out.data(), 1, out.size(), o) != out.size() || fclose(o) != 0) {
    fprintf(stderr, "%s: cannot write: %s\n", argv[2], strerror(errno));
    return 1;
  }
  return 0;
}
