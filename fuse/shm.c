// SPDX-License-Identifier: Apache-2.0
/*
 * The memory a worker's successor finds (see supervisor.c). The
 * supervisor maps one memfd before it forks any worker, so every worker
 * sees it at the same address. The filesystem's state, the nodes and
 * the open file handles live there: node ids and file handles are
 * pointers into it, and stay valid across a worker's death.
 *
 * A worker may die at any instruction. Every change to the allocator's
 * own state is a single store: a block is taken from a free list by
 * moving the head on, given back by linking it in front and then moving
 * the head, and carved from the unused end by writing its class and then
 * moving the end past it. A death between two stores leaks a block and
 * corrupts nothing. The locks a dead worker held are reset by its
 * successor, the only process that uses them from then on.
 *
 * Blocks come in size classes, each with a free list. A block's 8-byte
 * header holds its class and a tag saying what it holds (a node, a file
 * handle, or something else); data are 8-byte aligned, as every field
 * of a node or a file handle needs. A successor walks the blocks from
 * the first to the end to find every node and handle (sfs_shm_walk):
 * no list a dead worker may have left half-linked is followed. Freed
 * memory stays in the lists for reuse: the mapping is sparse, and only
 * what was ever used is resident, but for big blocks, whose pages go
 * back to the system when they are freed (sfs_shm_release).
 */
#define _GNU_SOURCE
#include <errno.h>
#include <stddef.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include "stratafs.h"

#define SFS_SHM_ALIGN 16

/*
 * Class i holds blocks of sfs_shm_sizes[i] bytes, header included. Up to
 * 256 bytes a class every 8: a node is sized to its name (inode.c), and
 * a tree holds one per entry, so the space a class rounds up to is paid
 * per entry (3.5 MiB of a 130,000-entry tree's 25 MiB with classes 64
 * bytes apart). The 24-byte class fits a parked entry's file handle (16
 * bytes on ext4 and xfs).
 */
#define SFS_SHM_SMALL_STEP 8
#define SFS_SHM_SMALL_MIN 24
#define SFS_SHM_SMALL_MAX 256
static const uint32_t sfs_shm_sizes[SFS_SHM_CLASSES] = {
	24, 32, 40, 48, 56, 64, 72, 80, 88, 96, 104, 112, 120, 128, 136,
	144, 152, 160, 168, 176, 184, 192, 200, 208, 216, 224, 232, 240,
	248, 256, 384, 512, 768, 1024, 1536, 2048, 4096, 8192, 16384,
	32768, 65536, 1 << 17, 1 << 18, 1 << 19, 1 << 20, 1 << 21, 1 << 22,
	1 << 23, 1 << 24, 1 << 25, 1 << 26,
};

/*
 * A freed block this big gives its pages back to the system, all but
 * the first (its header and the free list's link are there): a table
 * that grew by doubling leaves every smaller one behind, and nothing
 * else asks for their class again.
 */
#define SFS_SHM_RELEASE_MIN 8192

struct sfs_shm_block {
	uint32_t cls;		/* index into sfs_shm_sizes */
	_Atomic uint32_t tag;	/* enum sfs_shm_tag */
	char data[];
};

struct sfs_shm *sfs_shm;

static size_t sfs_shm_first(void)
{
	return (sizeof(*sfs_shm) + SFS_SHM_ALIGN - 1) &
	       ~(size_t)(SFS_SHM_ALIGN - 1);
}

/* FNV-1a, a byte at a time */
static uint64_t sfs_shm_hash(uint64_t h, uint64_t v)
{
	for (int b = 0; b < 64; b += 8) {
		h ^= (v >> b) & 0xff;
		h *= 1099511628211ULL;
	}
	return h;
}

/*
 * What a binary takes for granted about state another one made: a binary
 * exec'd to take over (supervisor.c) refuses state of another layout.
 * Sizes (the classes' too) catch most changes; SFS_SHM_VERSION is for
 * the rest.
 */
static uint64_t sfs_shm_layout(void)
{
	const uint64_t v[] = {
		SFS_SHM_VERSION, sizeof(struct sfs_shm), sizeof(struct sfs_fs),
		sizeof(struct sfs_node), sizeof(struct sfs_dirinfo),
		sizeof(struct sfs_entry), sizeof(struct sfs_file),
		SFS_SHM_CLASSES, sizeof(pthread_mutex_t),
	};
	uint64_t h = 14695981039346656037ULL;	/* FNV-1a */

	for (size_t i = 0; i < sizeof(v) / sizeof(v[0]); i++)
		h = sfs_shm_hash(h, v[i]);
	/* blocks are walked by their class's size (sfs_shm_walk) */
	for (int i = 0; i < SFS_SHM_CLASSES; i++)
		h = sfs_shm_hash(h, sfs_shm_sizes[i]);
	return h;
}

/*
 * Maps `size` bytes of a new memfd. Only the supervisor calls this, once,
 * before any worker exists: the workers inherit the mapping. The memfd
 * stays open, for a binary exec'd in the supervisor's place to map again.
 */
int sfs_shm_create(size_t size)
{
	struct sfs_shm *shm;
	int fd, ret;

	fd = memfd_create("stratafs-state", MFD_CLOEXEC);
	if (fd < 0)
		return -errno;
	if (ftruncate(fd, (off_t)size) < 0) {
		ret = -errno;
		goto out_close;
	}
	shm = mmap(NULL, size, PROT_READ | PROT_WRITE,
		   MAP_SHARED | MAP_NORESERVE, fd, 0);
	if (shm == MAP_FAILED) {
		ret = -errno;
		goto out_close;
	}
	shm->layout = sfs_shm_layout();
	shm->self = shm;
	shm->memfd = fd;
	shm->size = size;
	sfs_shm = shm;
	atomic_init(&shm->top, sfs_shm_first());
	sfs_shm_takeover();
	return 0;

out_close:
	close(fd);
	return ret;
}

/*
 * Maps the state a supervisor that exec'd this binary left in memfd FD,
 * at the address where its pointers point: -EPROTO if this binary lays
 * it out otherwise, -EADDRINUSE if the address is taken here.
 */
int sfs_shm_attach(int fd, void *addr)
{
	struct sfs_shm *shm;
	struct stat st;

	if (fstat(fd, &st) < 0)
		return -errno;
	shm = mmap(addr, (size_t)st.st_size, PROT_READ | PROT_WRITE,
		   MAP_SHARED | MAP_NORESERVE | MAP_FIXED_NOREPLACE, fd, 0);
	if (shm == MAP_FAILED)
		return errno == EEXIST ? -EADDRINUSE : -errno;
	if (shm != addr || shm->self != addr || shm->layout != sfs_shm_layout() ||
	    shm->size != (size_t)st.st_size) {
		/* an old kernel may take MAP_FIXED_NOREPLACE as a hint */
		munmap(shm, (size_t)st.st_size);
		return shm != addr ? -EADDRINUSE : -EPROTO;
	}
	sfs_shm = shm;
	return 0;
}

static int sfs_shm_class(size_t size)
{
	size += sizeof(struct sfs_shm_block);
	if (size <= SFS_SHM_SMALL_MIN)
		return 0;
	if (size <= SFS_SHM_SMALL_MAX)
		return (int)((size - SFS_SHM_SMALL_MIN + SFS_SHM_SMALL_STEP - 1) /
			     SFS_SHM_SMALL_STEP);
	for (int i = 0; i < SFS_SHM_CLASSES; i++)
		if (size <= sfs_shm_sizes[i])
			return i;
	return -1;
}

static struct sfs_shm_block *sfs_shm_block(void *p)
{
	return (struct sfs_shm_block *)((char *)p -
					offsetof(struct sfs_shm_block, data));
}

/* A block from the unused end, or NULL when the mapping is full. */
static struct sfs_shm_block *sfs_shm_carve(int cls)
{
	struct sfs_shm_block *b = NULL;
	size_t top;

	pthread_mutex_lock(&sfs_shm->top_lock);
	top = atomic_load(&sfs_shm->top);
	if (top + sfs_shm_sizes[cls] <= sfs_shm->size) {
		b = (struct sfs_shm_block *)((char *)sfs_shm + top);
		b->cls = (uint32_t)cls;
		atomic_store(&b->tag, SFS_SHM_OTHER);
		/* after the class: a walk never meets a block without one */
		atomic_store(&sfs_shm->top, top + sfs_shm_sizes[cls]);
	}
	pthread_mutex_unlock(&sfs_shm->top_lock);
	return b;
}

/*
 * Zeroed memory in the shared mapping, tagged SFS_SHM_OTHER, or NULL.
 * Before the supervisor made one (a unit program), plain calloc.
 */
void *sfs_shm_alloc(size_t size)
{
	struct sfs_shm_block *b;
	int cls;

	if (!sfs_shm)
		return calloc(1, size);
	cls = sfs_shm_class(size);
	if (cls < 0)
		return NULL;
	pthread_mutex_lock(&sfs_shm->lock[cls]);
	b = sfs_shm->free[cls];
	if (b)	/* one store takes it: a death after it only leaks it */
		sfs_shm->free[cls] = *(struct sfs_shm_block **)b->data;
	pthread_mutex_unlock(&sfs_shm->lock[cls]);
	if (!b)
		b = sfs_shm_carve(cls);
	if (!b)
		return NULL;
	SFS_TSAN_NEW(b->data, sfs_shm_sizes[cls] - sizeof(*b));
	/* not the class's whole size: the rest of a big block stays unbacked */
	memset(b->data, 0, size);
	atomic_store(&b->tag, SFS_SHM_OTHER);
	return b->data;
}

/*
 * Punches the pages of a free block out of the memfd, past the page that
 * holds its header. Nothing is lost if it fails: the pages stay, as
 * before. A block carved later is zeroed where it is used (sfs_shm_alloc),
 * which brings back only the pages it needs.
 */
static void sfs_shm_release(struct sfs_shm_block *b, size_t size)
{
	uintptr_t page = (uintptr_t)sysconf(_SC_PAGESIZE);
	uintptr_t from = ((uintptr_t)b->data + sizeof(void *) + page - 1) &
			 ~(page - 1);
	uintptr_t to = ((uintptr_t)b + size) & ~(page - 1);

	if (to > from)
		madvise((void *)from, to - from, MADV_REMOVE);
}

void sfs_shm_free(void *p)
{
	struct sfs_shm_block *b;
	int cls;

	if (!p)
		return;
	if (!sfs_shm) {
		free(p);
		return;
	}
	b = sfs_shm_block(p);
	cls = (int)b->cls;
	atomic_store(&b->tag, SFS_SHM_FREE);
	if (sfs_shm_sizes[cls] >= SFS_SHM_RELEASE_MIN)
		sfs_shm_release(b, sfs_shm_sizes[cls]);
	pthread_mutex_lock(&sfs_shm->lock[cls]);
	*(struct sfs_shm_block **)b->data = sfs_shm->free[cls];
	sfs_shm->free[cls] = b;
	pthread_mutex_unlock(&sfs_shm->lock[cls]);
}

char *sfs_shm_strdup(const char *s)
{
	size_t len = strlen(s) + 1;
	char *d = sfs_shm_alloc(len);

	return d ? memcpy(d, s, len) : NULL;
}

/*
 * Says what a block holds, once it is whole and in place: a successor
 * takes over the nodes and file handles the tags name, and never a
 * half-made one.
 */
void sfs_shm_tag(void *p, enum sfs_shm_tag tag)
{
	if (sfs_shm && p)
		atomic_store(&sfs_shm_block(p)->tag, tag);
}

/* Whether P's block holds what TAG says; always, without shared memory. */
bool sfs_shm_tagged(const void *p, enum sfs_shm_tag tag)
{
	return !sfs_shm ||
	       atomic_load(&sfs_shm_block((void *)p)->tag) == (uint32_t)tag;
}

/* Calls fn on every block tagged `tag`, in address order. */
void sfs_shm_walk(enum sfs_shm_tag tag, void (*fn)(void *p, void *arg),
		  void *arg)
{
	size_t off = sfs_shm_first(), top = atomic_load(&sfs_shm->top);

	while (off < top) {
		struct sfs_shm_block *b =
			(struct sfs_shm_block *)((char *)sfs_shm + off);

		if (b->cls >= SFS_SHM_CLASSES)
			break;	/* cannot be: the class is written first */
		if (atomic_load(&b->tag) == tag)
			fn(b->data, arg);
		off += sfs_shm_sizes[b->cls];
	}
}

/*
 * A worker takes over: nobody holds the allocator's locks any more,
 * whatever the dead worker held when it died.
 */
void sfs_shm_takeover(void)
{
	pthread_mutex_init(&sfs_shm->top_lock, NULL);
	for (int i = 0; i < SFS_SHM_CLASSES; i++)
		pthread_mutex_init(&sfs_shm->lock[i], NULL);
}
