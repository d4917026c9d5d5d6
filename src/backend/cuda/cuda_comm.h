/* cuda_comm.h: the NCCL transport of backend/comm.h (cuda_comm.cu). C API;
 * built with nvcc when nccl.h was found (HN_HAVE_NCCL). */
#ifndef HN_CUDA_COMM_H
#define HN_CUDA_COMM_H

#ifdef __cplusplus
extern "C" {
#endif

#include "../comm.h"

/* Makes c (its ranks set, every one a CUDA backend) an NCCL communicator:
 * loads libnccl, sets NCCL_NVLS_ENABLE=0, one communicator per rank's
 * device (ncclCommInitAll) and a stream each. HN_ERR_UNSUPPORTED when
 * libnccl cannot be loaded, HN_ERR_INVALID for two ranks on one device. */
hn_status cuda_comm_nccl_init(hn_comm *c, hn_err *err);

#ifdef __cplusplus
}
#endif

#endif
