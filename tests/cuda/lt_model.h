/* lt_model.h: the cuBLASLt host model's own entry (tests/cuda/lt_model.c) */
#ifndef CPLAN_LT_MODEL_H
#define CPLAN_LT_MODEL_H
/* how many times cublasLtMatmulAlgoGetHeuristic ran */
long long lt_model_heuristics(void);
#endif
