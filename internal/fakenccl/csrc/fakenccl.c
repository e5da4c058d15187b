// A stand-in libnccl for host-side tests (package fakenccl): the NCCL functions package comm binds, for
// ranks whose "device" memory is host memory (internal/fakecuda). ncclAllGather really gathers: each
// call records the rank's send and recv; the last rank of a round copies every send into every recv, in
// rank order. Every call returns at once; ncclCommGetAsyncError says ncclInProgress while the
// communicator's group is not complete or its last all-gather waits for other ranks, as a non-blocking
// NCCL communicator does. ncclCommAbort marks the communicator; its peers' pending all-gathers never
// complete (package comm aborts local peers itself).
//
// Ranks in other processes: where NCCL_COMM_ID is set, ncclGetUniqueId makes the id from it (as real
// NCCL encodes that address), so every process of a launch gets the same one, and the group lives in
// files of FAKENCCL_DIR (default /dev/shm, else /tmp): a header (the joined ranks, each round's arrivals
// and copies, under a spin lock) and a file a round, where each rank puts its send at its slot; a rank's
// ncclCommGetAsyncError copies the round's slots into its recv once every rank has arrived, and the last
// rank to copy removes the round's file (the last rank out, the header).
#include <fcntl.h>
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

typedef struct { char internal[128]; } ncclUniqueId;
typedef struct { size_t size; unsigned int magic; unsigned int version; int blocking; int cgaClusterSize; } cfg_t;

enum { OK = 0, INVALID_ARGUMENT = 4, INVALID_USAGE = 5, IN_PROGRESS = 7 };
enum { MAX_RANKS = 64, MAX_GROUPS = 256, ROUNDS = 4 };

typedef struct {
	uint64_t seq;            // the round's sequence number (1, 2, ...); 0: unused
	int arrived;             // ranks that called ncclAllGather in this round
	int done;                // the copies are made
	size_t bytes;            // per rank
	uintptr_t send[MAX_RANKS], recv[MAX_RANKS];
} round_t;

typedef struct {
	ncclUniqueId id;
	int nranks, joined, alive, used; // joined: ranks that ever joined; alive: not yet released
	round_t rounds[ROUNDS];
} group_t;

// A group across processes: the header file's contents.
typedef struct {
	uint64_t seq;
	int arrived, copied;
	size_t bytes;
} xround_t;

typedef struct {
	int lock;                // spin lock over the rest
	int nranks, joined, alive;
	xround_t rounds[ROUNDS];
} xgroup_t;

typedef struct {
	group_t* g;              // a group of this process, or NULL
	xgroup_t* x;             // else the mapped header of a group across processes
	char path[200];          // x's file; a round's is path.SEQ
	int rank, aborted;
	uint64_t seq;            // the communicator's last all-gather
	void* recv;              // x: its recv, until copied
	int copied;              // x: the last all-gather's slots are in recv
} comm_t;

static pthread_mutex_t mu = PTHREAD_MUTEX_INITIALIZER;
static group_t groups[MAX_GROUPS];
static uint64_t next_id = 1;

int ncclGetVersion(int* v) { *v = 22803; return OK; }

static const char xtag[] = "fakenccl-x:";

int ncclGetUniqueId(ncclUniqueId* id) {
	memset(id, 0, sizeof *id);
	const char* addr = getenv("NCCL_COMM_ID");
	if (addr && *addr) {
		snprintf(id->internal, sizeof id->internal, "%s%s", xtag, addr);
		return OK;
	}
	pthread_mutex_lock(&mu);
	uint64_t n = next_id++;
	memcpy(id->internal, "fakenccl", 8);
	memcpy(id->internal + 8, &n, sizeof n);
	pthread_mutex_unlock(&mu);
	return OK;
}

static void xlock(xgroup_t* x) {
	while (__atomic_test_and_set(&x->lock, __ATOMIC_ACQUIRE)) usleep(50);
}
static void xunlock(xgroup_t* x) { __atomic_clear(&x->lock, __ATOMIC_RELEASE); }

// xmap maps path at size bytes, or returns NULL; with create, a missing file is made (zero-filled) and
// every file sized, else a missing file or one of another size is an error.
static void* xmap(const char* path, size_t size, int create) {
	int fd = open(path, create ? O_RDWR | O_CREAT : O_RDWR, 0600);
	if (fd < 0) return NULL;
	void* p = NULL;
	if (create ? ftruncate(fd, (off_t)size) == 0 : lseek(fd, 0, SEEK_END) == (off_t)size) {
		p = mmap(NULL, size, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
		if (p == MAP_FAILED) p = NULL;
	}
	close(fd);
	return p;
}

static void round_path(const comm_t* c, uint64_t seq, char* out, size_t n) {
	snprintf(out, n, "%s.%llu", c->path, (unsigned long long)seq);
}

// xinit joins rank of a group across processes named by id (xtag and NCCL_COMM_ID's address).
static int xinit(void** comm, int nranks, ncclUniqueId id, int rank) {
	const char* dir = getenv("FAKENCCL_DIR");
	if (!dir || !*dir) dir = access("/dev/shm", W_OK) == 0 ? "/dev/shm" : "/tmp";
	uint64_t h = 1469598103934665603ull; // FNV-1a of the id
	for (int i = 0; i < 128 && id.internal[i]; i++) h = (h ^ (unsigned char)id.internal[i]) * 1099511628211ull;
	comm_t* c = calloc(1, sizeof *c);
	snprintf(c->path, sizeof c->path, "%s/fakenccl-%016llx-%d", dir, (unsigned long long)h, nranks);
	c->x = xmap(c->path, sizeof(xgroup_t), 1);
	if (!c->x) {
		free(c);
		return INVALID_USAGE;
	}
	xlock(c->x);
	if (c->x->nranks == 0) c->x->nranks = nranks;
	int ok = c->x->nranks == nranks;
	if (ok) {
		c->x->joined++;
		c->x->alive++;
	}
	xunlock(c->x);
	if (!ok) {
		munmap(c->x, sizeof(xgroup_t));
		free(c);
		return INVALID_USAGE;
	}
	c->rank = rank;
	c->copied = 1;
	*comm = c;
	return OK;
}

static int init(void** comm, int nranks, ncclUniqueId id, int rank) {
	if (nranks < 1 || nranks > MAX_RANKS || rank < 0 || rank >= nranks) return INVALID_ARGUMENT;
	if (memcmp(id.internal, xtag, sizeof xtag - 1) == 0) return xinit(comm, nranks, id, rank);
	pthread_mutex_lock(&mu);
	group_t* g = NULL;
	for (int i = 0; i < MAX_GROUPS && !g; i++)
		if (groups[i].used && memcmp(groups[i].id.internal, id.internal, 128) == 0) g = &groups[i];
	for (int i = 0; i < MAX_GROUPS && !g; i++)
		if (!groups[i].used) {
			g = &groups[i];
			memset(g, 0, sizeof *g);
			g->used = 1;
			g->id = id;
			g->nranks = nranks;
		}
	if (!g || g->nranks != nranks) {
		pthread_mutex_unlock(&mu);
		return INVALID_USAGE;
	}
	comm_t* c = calloc(1, sizeof *c);
	c->g = g;
	c->rank = rank;
	g->joined++;
	g->alive++;
	pthread_mutex_unlock(&mu);
	*comm = c;
	return OK;
}

int ncclCommInitRank(void** comm, int nranks, ncclUniqueId id, int rank) { return init(comm, nranks, id, rank); }

int ncclCommInitRankConfig(void** comm, int nranks, ncclUniqueId id, int rank, cfg_t* cfg) {
	if (cfg->magic != 0xcafebeef) return INVALID_ARGUMENT;
	return init(comm, nranks, id, rank);
}

static size_t type_size(int dt) {
	switch (dt) {
	case 0: case 1: return 1;              // ncclInt8, ncclUint8
	case 2: case 3: case 7: return 4;      // ncclInt32, ncclUint32, ncclFloat32
	case 4: case 5: case 8: return 8;      // ncclInt64, ncclUint64, ncclFloat64
	case 6: case 9: return 2;              // ncclFloat16, ncclBfloat16
	}
	return 0;
}

// xallgather puts send at the rank's slot of the round's file and counts the rank in.
static int xallgather(comm_t* c, const void* send, void* recv, size_t bytes) {
	xgroup_t* x = c->x;
	uint64_t seq = ++c->seq;
	xround_t* r = &x->rounds[seq % ROUNDS];
	xlock(x);
	int ok = 1;
	if (r->seq != seq) {
		if (r->seq != 0 && r->copied < x->nranks) ok = 0; // a round ROUNDS back still open
		else {
			memset(r, 0, sizeof *r);
			r->seq = seq;
			r->bytes = bytes;
		}
	}
	if (ok && r->bytes != bytes) ok = 0;
	xunlock(x);
	if (!ok) return INVALID_USAGE;
	char path[220];
	round_path(c, seq, path, sizeof path);
	char* data = xmap(path, (size_t)x->nranks * bytes, 1);
	if (!data) return INVALID_USAGE;
	memcpy(data + (size_t)c->rank * bytes, send, bytes);
	munmap(data, (size_t)x->nranks * bytes);
	c->recv = recv;
	c->copied = 0;
	xlock(x);
	r->arrived++;
	xunlock(x);
	return OK;
}

// xpoll copies the last round's slots into the rank's recv once every rank has arrived; it says
// whether the rank's all-gather is done (1), not yet (0), or cannot be (-1: the round's file is gone
// or not the round's size).
static int xpoll(comm_t* c) {
	if (c->copied) return 1;
	xgroup_t* x = c->x;
	xround_t* r = &x->rounds[c->seq % ROUNDS];
	xlock(x);
	int all = r->seq == c->seq && r->arrived == x->nranks;
	size_t bytes = r->bytes;
	xunlock(x);
	if (!all) return 0;
	char path[220];
	round_path(c, c->seq, path, sizeof path);
	char* data = xmap(path, (size_t)x->nranks * bytes, 0);
	if (!data) return -1;
	memcpy(c->recv, data, (size_t)x->nranks * bytes);
	munmap(data, (size_t)x->nranks * bytes);
	c->copied = 1;
	xlock(x);
	int last = ++r->copied == x->nranks;
	xunlock(x);
	if (last) unlink(path);
	return 1;
}

int ncclAllGather(const void* send, void* recv, size_t count, int dt, void* comm, void* stream) {
	comm_t* c = comm;
	size_t ts = type_size(dt);
	if (!c || !ts || count == 0) return INVALID_ARGUMENT;
	if (c->x) return xallgather(c, send, recv, count * ts);
	pthread_mutex_lock(&mu);
	group_t* g = c->g;
	uint64_t seq = ++c->seq;
	round_t* r = &g->rounds[seq % ROUNDS];
	if (r->seq != seq) {
		if (r->seq != 0 && !r->done) { // a round ROUNDS back still open: ranks too far apart
			pthread_mutex_unlock(&mu);
			return INVALID_USAGE;
		}
		memset(r, 0, sizeof *r);
		r->seq = seq;
		r->bytes = count * ts;
	}
	if (r->bytes != count * ts) {
		pthread_mutex_unlock(&mu);
		return INVALID_USAGE;
	}
	r->send[c->rank] = (uintptr_t)send;
	r->recv[c->rank] = (uintptr_t)recv;
	if (++r->arrived == g->nranks) {
		// Every rank's send lands in every rank's recv, in rank order; a rank's own slot may be its send.
		for (int d = 0; d < g->nranks; d++)
			for (int s = 0; s < g->nranks; s++) {
				char* dst = (char*)r->recv[d] + (size_t)s * r->bytes;
				if ((uintptr_t)dst != r->send[s]) memmove(dst, (const void*)r->send[s], r->bytes);
			}
		r->done = 1;
	}
	pthread_mutex_unlock(&mu);
	return OK;
}

int ncclGroupStart(void) { return OK; }
int ncclGroupEnd(void) { return OK; }

int ncclCommGetAsyncError(void* comm, int* st) {
	comm_t* c = comm;
	if (!c) return INVALID_ARGUMENT;
	if (c->x) {
		xlock(c->x);
		int joined = c->x->joined == c->x->nranks;
		xunlock(c->x);
		int done = joined ? xpoll(c) : 0;
		*st = done > 0 ? OK : done < 0 ? INVALID_USAGE : IN_PROGRESS;
		return OK;
	}
	pthread_mutex_lock(&mu);
	group_t* g = c->g;
	*st = OK;
	if (g->joined < g->nranks) *st = IN_PROGRESS;
	else if (c->seq > 0) {
		round_t* r = &g->rounds[c->seq % ROUNDS];
		if (r->seq == c->seq && !r->done) *st = IN_PROGRESS;
	}
	pthread_mutex_unlock(&mu);
	return OK;
}

int ncclCommFinalize(void* comm) { return comm ? OK : INVALID_ARGUMENT; }

static int release(void* comm) {
	comm_t* c = comm;
	if (!c) return INVALID_ARGUMENT;
	if (c->x) {
		xlock(c->x);
		int last = --c->x->alive == 0;
		xunlock(c->x);
		munmap(c->x, sizeof(xgroup_t));
		if (last) unlink(c->path);
		free(c);
		return OK;
	}
	pthread_mutex_lock(&mu);
	if (--c->g->alive == 0) c->g->used = 0; // the last rank out frees the group's slot
	pthread_mutex_unlock(&mu);
	free(c);
	return OK;
}

int ncclCommAbort(void* comm) {
	if (comm) ((comm_t*)comm)->aborted = 1;
	return release(comm);
}
int ncclCommDestroy(void* comm) { return release(comm); }

const char* ncclGetErrorString(int rc) {
	switch (rc) {
	case OK: return "fakenccl: no error";
	case INVALID_ARGUMENT: return "fakenccl: invalid argument";
	case INVALID_USAGE: return "fakenccl: invalid usage";
	case IN_PROGRESS: return "fakenccl: in progress";
	}
	return "fakenccl: unknown result";
}
const char* ncclGetLastError(void* comm) { return ""; }
