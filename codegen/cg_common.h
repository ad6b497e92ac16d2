/* cg_common.h: what the CPU emitter (emit_c.c) and the CUDA emitter (emit_cu.c) share
 * (cg_common.c): C literals of strings, shapes and floats, paths, the CPLAN_FUSION switch, the
 * source line a comment quotes, and the dropout stream key of a node. */
#ifndef CPLAN_CG_COMMON_H
#define CPLAN_CG_COMMON_H

#include "../compiler/fusion.h"
#include "../compiler/ir.h"

const char *cg_c_string(const char *s);                 /* a C string literal of s ("NULL" for NULL) */
const char *cg_shape_list(const Shape *s);              /* "{2, 3}" */
const char *cg_abs_path(const char *p);                 /* p made absolute (NULL stays NULL) */
int64_t cg_dims_prod(const Shape *s, int lo, int hi);   /* d[lo] * ... * d[hi-1] */
const char *cg_flt(double v);                           /* a float literal, NAN and INFINITY included */
bool cg_fusion_enabled(void);                           /* CPLAN_FUSION != 0 */
Fusion *cg_no_fusion(const Graph *g);                   /* a fusion result with no groups */
const char *cg_src_line_text(Span sp);                  /* the source line of sp, for comments */
uint64_t cg_node_key(int i);                            /* the dropout stream of node i */

#endif
