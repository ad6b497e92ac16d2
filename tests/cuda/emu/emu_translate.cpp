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
 *   asm("cvt.rn.f16.f32 %0, %1;" : "=h"(h) : "f"(f))  ->  (h) = ::cuemu::ptx::cvt_rn_f16_f32(f)
 *       (one instruction, one output, one input: the PTX of codegen/emit_cu_support.h);
 * Anything else is left to cuda_emu.h's macros. An unreadable launch or asm is an error
 * ("IN:line: ..."), exit 1.
 *
 *   emu_translate --entries IN.cu OUT.cpp
 *
 * also appends, for every `extern "C" __global__ void NAME(...)`, the trampoline
 * `extern "C" void cuemu_entry_NAME(dim3 grid, dim3 block, size_t smem, cudaStream_t s, void **args)`
 * that cudaLaunchKernel of a kernel compiled at run time calls (emu_cuda_rt.cpp). */
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

size_t skip_space(size_t i) {
  while (i < src.size() && space_char(src[i])) i++;
  return i;
}

/* a string literal at i: its text (no escapes), i moved past it */
std::string literal(size_t &i, size_t at) {
  if (i >= src.size() || src[i] != '"') fail(at, "asm: expected a string literal");
  size_t e = src.find('"', i + 1);
  if (e == std::string::npos) fail(at, "asm: unterminated string");
  std::string t = src.substr(i + 1, e - i - 1);
  i = e + 1;
  return t;
}

/* a parenthesized expression at i: its text, i moved past it */
std::string paren(size_t &i, size_t at) {
  i = skip_space(i);
  if (i >= src.size() || src[i] != '(') fail(at, "asm: expected (");
  int depth = 0;
  size_t b = i;
  for (; i < src.size(); i++) {
    if (src[i] == '(') depth++;
    else if (src[i] == ')' && --depth == 0) break;
  }
  if (depth != 0) fail(at, "asm: unbalanced ()");
  i++;
  return src.substr(b + 1, i - b - 2);
}

/* asm [volatile] ("OP %0, %1;" : "=c"(out) : "c"(in)) at i; returns the position after it */
size_t asm_stmt(size_t i) {
  size_t k = skip_space(i + 3);
  if (word_at(k, "volatile")) k = skip_space(k + 8);
  else if (word_at(k, "__volatile__")) k = skip_space(k + 12);
  if (k >= src.size() || src[k] != '(') return i + 3; /* not an asm statement */
  k = skip_space(k + 1);
  std::string ins = literal(k, i);
  k = skip_space(k);
  if (src[k] != ':') fail(i, "asm: only the form asm(\"OP %0, %1;\" : \"=c\"(out) : \"c\"(in)) is emulated");
  k = skip_space(k + 1);
  literal(k, i);
  std::string out = paren(k, i);
  k = skip_space(k);
  if (src[k] != ':') fail(i, "asm: expected : and the input");
  k = skip_space(k + 1);
  literal(k, i);
  std::string in = paren(k, i);
  k = skip_space(k);
  if (src[k] != ')') fail(i, "asm: one output and one input only");
  k++;
  size_t sp = ins.find(' ');
  std::string op = ins.substr(0, sp);
  if (sp == std::string::npos || ins.compare(sp, std::string::npos, " %0, %1;") != 0)
    fail(i, "asm: only one instruction `OP %0, %1;` is emulated");
  std::replace(op.begin(), op.end(), '.', '_');
  std::string text = "(" + out + ") = ::cuemu::ptx::" + op + "(" + in + ")";
  text.append((size_t)std::count(src.begin() + (long)i, src.begin() + (long)k, '\n'), '\n');
  edits.push_back({i, k - i, text});
  return k;
}

/* the kernels of `extern "C" __global__ void NAME(` */
std::vector<std::string> entry_names;
void entry(size_t i) {
  size_t k = skip_space(i + 6);
  if (src.compare(k, 3, "\"C\"") != 0) return;
  k = skip_space(k + 3);
  if (!word_at(k, "__global__")) return;
  k = skip_space(k + 10);
  if (!word_at(k, "void")) return;
  k = skip_space(k + 4);
  size_t b = k;
  while (k < src.size() && ident_char(src[k])) k++;
  if (k == b) fail(i, "no kernel name after extern \"C\" __global__ void");
  if (src[skip_space(k)] != '(') return;
  entry_names.push_back(src.substr(b, k - b));
}

} // namespace

int main(int argc, char **argv) {
  bool entries = argc == 4 && strcmp(argv[1], "--entries") == 0;
  if (entries) argv++, argc--;
  if (argc != 3) {
    fprintf(stderr, "usage: emu_translate [--entries] IN.cu OUT.cpp\n");
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
    if (word_at(i, "asm")) {
      i = asm_stmt(i);
      continue;
    }
    if (entries && word_at(i, "extern")) entry(i);
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
  if (entries) {
    out += "\n/* emu_translate --entries: cudaLaunchKernel's trampolines */\n";
    for (const std::string &n : entry_names)
      out += "extern \"C\" void cuemu_entry_" + n + "(dim3 g, dim3 b, size_t smem, cudaStream_t s, void **args) {\n"
             "  ::cuemu::launch_packed(\"" + n + "\", " + n + ", g, b, smem, s, args);\n}\n";
  }

  FILE *o = fopen(argv[2], "wb");
  if (!o || fwrite(out.data(), 1, out.size(), o) != out.size() || fclose(o) != 0) {
    fprintf(stderr, "%s: cannot write: %s\n", argv[2], strerror(errno));
    return 1;
  }
  return 0;
}
