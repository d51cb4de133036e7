// SPDX-License-Identifier: Apache-2.0
/*
 * The host's switch for FUSE over io_uring. The kernel offers it in a
 * mount's INIT only while the module parameter fuse.enable_uring is set
 * (Linux 6.14+, STRATA_FUSE_URING_PARAM). It is one switch for the whole
 * machine, read at each INIT: a daemon that does not ask for io_uring
 * never sees it, and a mount keeps what its INIT agreed. The plugin's
 * own daemons are supervised and serve through /dev/fuse whatever it
 * says (fuse/uring.c tells why); the switch is for daemons that serve
 * over rings, `stratafs -o nosupervisor` among them.
 *
 * --fuse-uring says what the plugin does with it, once, at start:
 *   off    (the default) leaves it as found. Nothing here ever writes 0:
 *          another user of the host may rely on it being set.
 *   on     writes 1 when it reads 0. A /sys mounted read-only (an
 *          unprivileged container) cannot be written: the log says how
 *          to set it on the host instead, and the plugin starts all the
 *          same, as it does on a kernel without the parameter.
 *   leave  reports it, and does nothing else.
 * Each says in one log line what it found and what it did. A plugin
 * that serves only the Controller service mounts nothing on this
 * machine, and never touches it.
 */
#include <errno.h>
#include <fcntl.h>
#include <string.h>
#include <unistd.h>

#include "csi.h"

static const char *const csi_uring_modes[] = {
	[CSI_URING_OFF] = "off",
	[CSI_URING_ON] = "on",
	[CSI_URING_LEAVE] = "leave",
};

/* --fuse-uring's value by name: 0, or -EINVAL for a name it does not take. */
int csi_transport_parse(const char *name, enum csi_fuse_uring *mode)
{
	for (size_t i = 0; i < sizeof(csi_uring_modes) / sizeof(csi_uring_modes[0]);
	     i++)
		if (!strcmp(name, csi_uring_modes[i])) {
			*mode = (enum csi_fuse_uring)i;
			return 0;
		}
	return -EINVAL;
}

/*
 * The parameter: 1 set, 0 not, or -errno: -ENOENT when the kernel has
 * none, -EPROTO when it reads as neither.
 */
static int csi_transport_read(void)
{
	char buf[16];
	ssize_t n;
	int fd, err;

	fd = open(STRATA_FUSE_URING_PARAM, O_RDONLY | O_CLOEXEC);
	if (fd < 0)
		return -errno;
	n = read(fd, buf, sizeof(buf));
	err = errno;
	close(fd);
	if (n < 0)
		return -err;
	/* a bool parameter reads Y or N; 1 and 0 are what one writes */
	if (n > 0 && (buf[0] == 'Y' || buf[0] == 'y' || buf[0] == '1'))
		return 1;
	if (n > 0 && (buf[0] == 'N' || buf[0] == 'n' || buf[0] == '0'))
		return 0;
	return -EPROTO;
}

static int csi_transport_set(void)
{
	ssize_t n;
	int fd, err;

	fd = open(STRATA_FUSE_URING_PARAM, O_WRONLY | O_CLOEXEC);
	if (fd < 0)
		return -errno;
	n = write(fd, "1", 1);
	err = errno;
	close(fd);
	return n == 1 ? 0 : n < 0 ? -err : -EIO;
}

/* At start, before any thread: reads, perhaps sets, and says so. */
void csi_transport_init(const struct csi_config *c)
{
	const char *mode = csi_uring_modes[c->fuse_uring];
	bool on = c->fuse_uring == CSI_URING_ON;
	const char *did;
	int found, ret;

	if (!(c->modes & CSI_MODE_NODE)) {
		if (c->fuse_uring != CSI_URING_OFF)
			strata_info("FUSE over io_uring: --fuse-uring=%s ignored: this plugin serves only the Controller service, which mounts nothing here",
				    mode);
		return;
	}
	found = csi_transport_read();
	if (found == -ENOENT) {
		strata_log(on ? STRATA_LOG_WARN : STRATA_LOG_INFO,
			   "FUSE over io_uring: %s does not exist: this kernel has no FUSE over io_uring (Linux 6.14 and later, CONFIG_FUSE_IO_URING), or its fuse module is not loaded yet; nothing done (--fuse-uring=%s)",
			   STRATA_FUSE_URING_PARAM, mode);
		return;
	}
	if (found < 0) {
		strata_warn("FUSE over io_uring: %s: %s; nothing done (--fuse-uring=%s)",
			    STRATA_FUSE_URING_PARAM,
			    found == -EPROTO ? "reads as neither on nor off" :
			    strerror(-found), mode);
		return;
	}
	if (found || !on) {
		did = c->fuse_uring == CSI_URING_LEAVE ? "left as it is" :
		      on ? "nothing to do" :
		      found ? "left on, as other FUSE daemons on this host may use it" :
		      "left off";
		strata_info("FUSE over io_uring: fuse.enable_uring is %s; %s (--fuse-uring=%s)",
			    found ? "on" : "off", did, mode);
		return;
	}
	ret = csi_transport_set();
	if (ret == 0) {
		strata_info("FUSE over io_uring: fuse.enable_uring was off; turned on (--fuse-uring=on): FUSE daemons that ask for io_uring get it from their next mount");
		return;
	}
	strata_warn("FUSE over io_uring: fuse.enable_uring is off and cannot be turned on from here (%s: %s%s); set it on the host: 'echo 1 > %s' until the next boot, 'options fuse enable_uring=1' in /etc/modprobe.d/fuse.conf where fuse is a module, or 'fuse.enable_uring=1' on the kernel command line",
		    STRATA_FUSE_URING_PARAM, strerror(-ret),
		    ret == -EROFS ? ": /sys is read-only, as in an unprivileged container" : "",
		    STRATA_FUSE_URING_PARAM);
}
