/* SPDX-License-Identifier: Apache-2.0 */
/*
 * Between flatten.c (when, which run, the records) and flatten_merge.c
 * (the merged tree written out).
 */
#ifndef STRATA_CSI_FLATTEN_H
#define STRATA_CSI_FLATTEN_H

#include <stdatomic.h>
#include <stdint.h>

/* One merge: the run's layers, the layers below it, and the result. */
struct csi_flat_ctx {
	const int *range;	/* the run's roots, top first */
	int nrange;
	const int *below;	/* the roots of the layers below it */
	int nbelow;
	int out_root;		/* the new layer's root, empty */
	atomic_bool *cancel;	/* set when the plugin stops */
	void *links;		/* tsearch tree: files of several names */
	int64_t entries;	/* what was written, for the log */
	int64_t bytes;
};

/* flatten_merge.c */
int csi_flatten_merge(struct csi_flat_ctx *c);

#endif
