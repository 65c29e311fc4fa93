// SPDX-License-Identifier: Apache-2.0
package kdn

/*
#include "kdn_go.h"
*/
import "C"

// The package's constants are kdn.h's values, written out so that the
// documentation shows them; each line fails to compile unless the Go
// constant equals the C one (a constant array index must be 0).
var _ = [...]struct{}{
	[1]struct{}{}[StatusOK-C.KDN_OK],
	[1]struct{}{}[StatusInvalidArgument-C.KDN_ERR_INVALID_ARGUMENT],
	[1]struct{}{}[StatusNotFound-C.KDN_ERR_NOT_FOUND],
	[1]struct{}{}[StatusBusy-C.KDN_ERR_BUSY],
	[1]struct{}{}[StatusUnavailable-C.KDN_ERR_UNAVAILABLE],
	[1]struct{}{}[StatusCorrupt-C.KDN_ERR_CORRUPT],
	[1]struct{}{}[StatusUnsupported-C.KDN_ERR_UNSUPPORTED],
	[1]struct{}{}[StatusNoMemory-C.KDN_ERR_NO_MEMORY],
	[1]struct{}{}[StatusInternal-C.KDN_ERR_INTERNAL],
	[1]struct{}{}[StatusTimeout-C.KDN_ERR_TIMEOUT],
	[1]struct{}{}[StatusCancelled-C.KDN_ERR_CANCELLED],
	[1]struct{}{}[StatusVersion-C.KDN_ERR_VERSION],
	[1]struct{}{}[StatusBufferTooSmall-C.KDN_ERR_BUFFER_TOO_SMALL],
	[1]struct{}{}[BindingVersionMajor-C.KDN_VERSION_MAJOR],
	[1]struct{}{}[F32-C.KDN_DTYPE_F32],
	[1]struct{}{}[F16-C.KDN_DTYPE_F16],
	[1]struct{}{}[BF16-C.KDN_DTYPE_BF16],
	[1]struct{}{}[LayoutContiguous-C.KDN_LAYOUT_CONTIGUOUS],
	[1]struct{}{}[LayoutPagedNHD-C.KDN_LAYOUT_PAGED_NHD],
	[1]struct{}{}[LayoutPagedHND-C.KDN_LAYOUT_PAGED_HND],
	[1]struct{}{}[ResultLossy-C.KDN_RESULT_LOSSY],
	[1]struct{}{}[MaxTiers-C.KDN_MAX_TIERS],
	[1]struct{}{}[RopeInterleaved-C.KDN_ROPE_INTERLEAVED],
	[1]struct{}{}[RopeNeox-C.KDN_ROPE_NEOX],
	[1]struct{}{}[OpPending-C.KDN_OP_PENDING],
	[1]struct{}{}[OpDone-C.KDN_OP_DONE],
	[1]struct{}{}[OpFailed-C.KDN_OP_FAILED],
	[1]struct{}{}[OpCancelled-C.KDN_OP_CANCELLED],
	[1]struct{}{}[TierHost-C.KDN_TIER_HOST],
	[1]struct{}{}[TierDevice-C.KDN_TIER_DEVICE],
	[1]struct{}{}[TierDisk-C.KDN_TIER_DISK],
	[1]struct{}{}[TierRemote-C.KDN_TIER_REMOTE],
	[1]struct{}{}[TierRedis-C.KDN_TIER_REDIS],
	[1]struct{}{}[EvictLRU-C.KDN_EVICT_LRU],
	[1]struct{}{}[EvictS3FIFO-C.KDN_EVICT_S3FIFO],
	[1]struct{}{}[EvictCost-C.KDN_EVICT_COST],
	[1]struct{}{}[DeviceAuto-C.KDN_DEVICE_AUTO],
	[1]struct{}{}[DeviceNone-C.KDN_DEVICE_NONE],
	[1]struct{}{}[DeviceEmulated-C.KDN_DEVICE_EMULATED],
	[1]struct{}{}[DeviceCUDA-C.KDN_DEVICE_CUDA],
	[1]struct{}{}[LatencyLookup-C.KDN_LATENCY_LOOKUP],
	[1]struct{}{}[LatencyLoad-C.KDN_LATENCY_LOAD],
	[1]struct{}{}[LatencyStore-C.KDN_LATENCY_STORE],
}

// kdn.h's minor version may be newer than the one this package was written
// for (minors only append), never older (1.14: RuntimeOptions.EncryptionKeyFile
// and EncryptionKeyEnv set kdn_runtime_options.encryption_key_file and
// encryption_key_env; 1.13: Request.Salt sets kdn_request.salt,
// TierConfig.Quotas kdn_tier_config.quotas):
// an array of negative length does not compile.
var _ [C.KDN_VERSION_MINOR - BindingVersionMinor]struct{}
