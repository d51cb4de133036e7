// SPDX-License-Identifier: Apache-2.0
/*
 * Named kill points: the places between two steps of an RPC where a
 * crash of the plugin leaves the most to recover from. A test arms one
 * with STRATA_CSI_KILL_AT=<name> in the plugin's environment; the plugin
 * then dies by SIGKILL the first time it gets there, as an OOM kill or
 * a node failure would make it, and the test checks what a restarted
 * plugin and kubelet's retries make of it. Unarmed, a kill point costs a
 * string compare.
 */
#include <signal.h>
#include <stdlib.h>
#include <string.h>

#include "csi.h"

static const char *csi_kill_at;

void csi_kill_points_init(void)
{
	const char *at = getenv("STRATA_CSI_KILL_AT");

	csi_kill_at = at && at[0] ? at : NULL;
	if (csi_kill_at)
		strata_warn("kill point %s is armed: the plugin dies there",
			    csi_kill_at);
}

void csi_kill_point(const char *name)
{
	if (!csi_kill_at || strcmp(csi_kill_at, name))
		return;
	strata_warn("kill point %s: SIGKILL", name);
	raise(SIGKILL);
}
