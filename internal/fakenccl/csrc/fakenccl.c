// A stand-in libnccl for host-side tests (package fakenccl): the NCCL functions package comm binds, for
// ranks in one process whose "device" memory is host memory (internal/fakecuda). ncclAllGather really
// gathers: each call records the rank's send and recv; the last rank of a round copies every send
// into every recv, in rank order. Every call returns at once; ncclCommGetAsyncError says
// ncclInProgress while the communicator's group is not complete or its last all-gather waits for other
// ranks, as a non-blocking NCCL communicator does. ncclCommAbort marks the communicator; its peers'
// pending all-gathers never complete (package comm aborts local peers itself).
#include <pthread.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

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

typedef struct {
	group_t* g;
	int rank, aborted;
	uint64_t seq;            // the communicator's last all-gather
} comm_t;

static pthread_mutex_t mu = PTHREAD_MUTEX_INITIALIZER;
static group_t groups[MAX_GROUPS];
static uint64_t next_id = 1;

int ncclGetVersion(int* v) { *v = 22803; return OK; }

int ncclGetUniqueId(ncclUniqueId* id) {
	pthread_mutex_lock(&mu);
	memset(id, 0, sizeof *id);
	uint64_t n = next_id++;
	memcpy(id->internal, "fakenccl", 8);
	memcpy(id->internal + 8, &n, sizeof n);
	pthread_mutex_unlock(&mu);
	return OK;
}

static int init(void** comm, int nranks, ncclUniqueId id, int rank) {
	if (nranks < 1 || nranks > MAX_RANKS || rank < 0 || rank >= nranks) return INVALID_ARGUMENT;
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

int ncclAllGather(const void* send, void* recv, size_t count, int dt, void* comm, void* stream) {
	comm_t* c = comm;
	size_t ts = type_size(dt);
	if (!c || !ts || count == 0) return INVALID_ARGUMENT;
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
