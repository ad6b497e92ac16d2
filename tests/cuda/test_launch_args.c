/* test_launch_args.c: the launchers of kernels_cuda.h refuse bad shapes and arguments with -1
 * and a message naming the launcher, before touching the GPU (ctest cuda.launch_args, no GPU
 * needed). Where no GPU is present, a launch with good arguments must also come back as -1
 * with the CUDA error ("launch failed: ..."), never a crash. */
#include "kernels_cuda.h"

#include <stdio.h>
#include <string.h>

static int failures;

/* rc must be -1 and the message must start with launcher and contain part */
static void refused(int rc, const char *launcher, const char *part) {
  const char *m = cplan_cuda_error();
  if (rc != -1 || strncmp(m, launcher, strlen(launcher)) != 0 || !strstr(m, part)) {
    printf("FAILED: %s: rc %d, message '%s' (want -1, '%s')\n", launcher, rc, m, part);
    failures++;
  } else {
    printf("ok: %s\n", m);
  }
}

int main(void) {
  float x[8] = {0}; /* never read: every call below fails before launching */
  void *p = x;
  refused(cplan_cuda_layernorm_forward(CPLAN_F32, p, NULL, NULL, p, p, p, 4, 0, 1e-5f, 0),
          "cplan_cuda_layernorm_forward", "bad shape [4, 0]");
  refused(cplan_cuda_layernorm_forward(CPLAN_F32, p, NULL, NULL, p, p, p, 4, 8, -1.0f, 0),
          "cplan_cuda_layernorm_forward", "eps");
  refused(cplan_cuda_layernorm_forward(CPLAN_F32, p, NULL, NULL, p, p, NULL, 4, 8, 1e-5f, 0),
          "cplan_cuda_layernorm_forward", "must not be NULL");
  refused(cplan_cuda_rmsnorm_backward(CPLAN_F32, p, NULL, p, p, NULL, x, 4, 8, 0), "cplan_cuda_rmsnorm_backward",
          "dx needs w");
  refused(cplan_cuda_layernorm_backward((CplanDtype)7, p, NULL, NULL, p, p, p, x, x, 4, 8, 0),
          "cplan_cuda_layernorm_backward", "unknown dtype 7");
  refused(cplan_cuda_softmax_forward(CPLAN_BF16, p, p, -1, 8, 0), "cplan_cuda_softmax_forward", "bad shape");
  refused(cplan_cuda_safe_softmax_forward(CPLAN_F32, p, p, 4, 0, 0), "cplan_cuda_safe_softmax_forward", "bad shape");
  refused(cplan_cuda_attention_forward(CPLAN_F32, p, x, p, p, p, 2, 16, 288, 1, 0), "cplan_cuda_attention_forward",
          "head dim above 256");
  refused(cplan_cuda_attention_backward(CPLAN_F32, p, p, p, NULL, p, p, x, p, p, p, 2, 16, 64, 1, 0),
          "cplan_cuda_attention_backward", "must not be NULL");
  refused(cplan_cuda_gelu_forward(CPLAN_F32, p, p, -5, 0), "cplan_cuda_gelu_forward", "negative size");
  refused(cplan_cuda_silu_backward(CPLAN_F32, NULL, p, p, 10, 0), "cplan_cuda_silu_backward", "must not be NULL");
  refused(cplan_cuda_cross_entropy_forward(CPLAN_F32, x, x, x, NULL, p, NULL, 4, 10, 0),
          "cplan_cuda_cross_entropy_forward", "must not be NULL");
  refused(cplan_cuda_cross_entropy_backward(CPLAN_F32, p, x, NULL, p, x, NULL, 4, 0, 0),
          "cplan_cuda_cross_entropy_backward", "bad shape [4, 0]");
  refused(cplan_cuda_embedding_forward(CPLAN_F32, p, p, NULL, 3, 0, 8, 0), "cplan_cuda_embedding_forward",
          "table [0, 8]");
  refused(cplan_cuda_rope_forward(CPLAN_F32, p, p, 2, 4, 7, 10000.0f, 0), "cplan_cuda_rope_forward", "odd");
  refused(cplan_cuda_rope_backward(CPLAN_F32, p, p, 2, 4, 8, 0.0f, 0), "cplan_cuda_rope_backward", "base");
  CplanAdamwHyper h = {.lr = 1e-3f, .beta1 = 0.9f, .beta2 = 0.999f, .eps = 1e-8f, .bc1 = 0.0f, .bc2 = 0.5f};
  CplanAdamwTensor t = {.param = x, .grad = x, .grad_dt = CPLAN_F32, .m = x, .v = x, .n = 8};
  refused(cplan_cuda_adamw(&t, &h, NULL, 0), "cplan_cuda_adamw_multi", "bias corrections");
  h.bc1 = 0.1f, h.beta2 = 1.5f;
  refused(cplan_cuda_adamw(&t, &h, NULL, 0), "cplan_cuda_adamw_multi", "bad hyperparameters");
  h.beta2 = 0.999f, t.m = NULL;
  refused(cplan_cuda_adamw(&t, &h, NULL, 0), "cplan_cuda_adamw_multi", "tensor 0: a NULL pointer");
  CplanNormTensor nt = {.x = x, .dt = CPLAN_F32, .n = 100000};
  double w[2];
  refused(cplan_cuda_global_norm(x, NULL, &nt, 1, 1.0f, w, 2, 0), "cplan_cuda_global_norm", "7 needed");

  /* good arguments: with no GPU the launch itself fails, and says so */
  int count = 0;
  if (cudaGetDeviceCount(&count) != cudaSuccess || count == 0)
    refused(cplan_cuda_gelu_forward(CPLAN_F32, p, p, 8, 0), "cplan_cuda_gelu_forward", "launch failed");
  else
    printf("note: a GPU is present: the launch-failure path was not exercised\n");
  printf("%s: launcher argument checks\n", failures ? "FAILED" : "ok");
  return failures ? 1 : 0;
}
