/* A minimal NVTX v3 tool: what Nsight Systems does when it records push/pop ranges, minus the
 * timeline. Built by tests/nvtx_tool.py into a shared library; a process started with
 * NVTX_INJECTION64_PATH=<that library> loads it at its first NVTX call, and then every range the
 * process pushes or pops reaches the functions below.
 *
 * With HPCPIPE_NVTX_LOG=<file>, each event is appended to the file as one line:
 *     push <domain> <message>[ <integer payload>]
 *     pop <domain>
 * (domain "-" is the default domain). Without it the tool records nothing, which is how
 * benchmarks/nvtx_overhead.py measures what hpcpipe's own calls cost under a profiler.
 *
 * The declarations follow the NVTX v3 headers (nvtx3/nvtxDetail/nvtxTypes.h, nvToolsExt.h); they
 * are spelled out here so the test builds with gcc alone, without the CUDA toolkit's headers.
 */
#include <fcntl.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include <wchar.h>

typedef void (*NvtxFunctionPointer)(void);
typedef NvtxFunctionPointer **NvtxFunctionTable; /* slot pointers, indexed by callback id */
typedef struct {
    size_t struct_size;
    int (*GetModuleFunctionTable)(int module, NvtxFunctionTable *out_table, unsigned int *out_size);
} NvtxExportTableCallbacks;
typedef const void *(*NvtxGetExportTableFunc_t)(uint32_t export_table_id);

enum { ETID_CALLBACKS = 1, MODULE_CORE = 1, MODULE_CORE2 = 5 };
enum { CORE_RangePushEx = 8, CORE_RangePushA = 9, CORE_RangePop = 11 };
enum { CORE2_RangePushEx = 4, CORE2_RangePop = 5, CORE2_RegisterStringA = 10, CORE2_CreateA = 12 };
enum { MESSAGE_ASCII = 1, MESSAGE_REGISTERED = 3 };
enum { PAYLOAD_UINT64 = 1, PAYLOAD_INT64 = 2 };

typedef struct {
    uint16_t version;
    uint16_t size;
    uint32_t category;
    int32_t colorType;
    uint32_t color;
    int32_t payloadType;
    int32_t reserved0;
    union {
        uint64_t ullValue;
        int64_t llValue;
        double dValue;
    } payload;
    int32_t messageType;
    union {
        const char *ascii;
        const wchar_t *unicode;
        const void *registered; /* what RegisterStringA returned: here, a copy of the string */
    } message;
} EventAttributes;

typedef struct {
    char *name;
} Domain; /* what DomainCreateA returns */

static int log_fd = -1;

static void emit(const char *line) {
    if (log_fd >= 0) {
        ssize_t ignored = write(log_fd, line, strlen(line)); /* O_APPEND: one write per line */
        (void)ignored;
    }
}

static const char *domain_name(const void *domain) {
    return domain ? ((const Domain *)domain)->name : "-";
}

static int push(const void *domain, const EventAttributes *attr) {
    char line[512];
    const char *message = "?";
    if (attr && attr->messageType == MESSAGE_REGISTERED && attr->message.registered)
        message = (const char *)attr->message.registered;
    else if (attr && attr->messageType == MESSAGE_ASCII && attr->message.ascii)
        message = attr->message.ascii;
    if (attr && (attr->payloadType == PAYLOAD_INT64 || attr->payloadType == PAYLOAD_UINT64))
        snprintf(line, sizeof line, "push %s %s %lld\n", domain_name(domain), message,
                 (long long)attr->payload.llValue);
    else
        snprintf(line, sizeof line, "push %s %s\n", domain_name(domain), message);
    emit(line);
    return 0;
}

static int pop(const void *domain) {
    char line[256];
    snprintf(line, sizeof line, "pop %s\n", domain_name(domain));
    emit(line);
    return 0;
}

static int range_push_ex(const EventAttributes *attr) { return push(NULL, attr); }
static int range_push_a(const char *message) {
    EventAttributes attr = {0};
    attr.messageType = MESSAGE_ASCII;
    attr.message.ascii = message;
    return push(NULL, &attr);
}
static int range_pop(void) { return pop(NULL); }
static int domain_push_ex(const void *domain, const EventAttributes *attr) { return push(domain, attr); }
static int domain_pop(const void *domain) { return pop(domain); }
static const void *register_string(const void *domain, const char *text) {
    (void)domain;
    return strdup(text); /* kept for the life of the process, as a tool keeps its string table */
}
static const void *create_domain(const char *name) {
    Domain *domain = malloc(sizeof *domain);
    domain->name = strdup(name);
    return domain;
}

static void set(NvtxFunctionTable table, unsigned int size, unsigned int id, NvtxFunctionPointer fn) {
    if (table && id < size && table[id])
        *table[id] = fn;
}

int InitializeInjectionNvtx2(NvtxGetExportTableFunc_t get_export_table) {
    const NvtxExportTableCallbacks *callbacks = get_export_table(ETID_CALLBACKS);
    NvtxFunctionTable core = NULL, core2 = NULL;
    unsigned int core_size = 0, core2_size = 0;
    const char *path = getenv("HPCPIPE_NVTX_LOG");
    if (!callbacks || callbacks->struct_size < sizeof(NvtxExportTableCallbacks))
        return 0;
    if (!callbacks->GetModuleFunctionTable(MODULE_CORE, &core, &core_size) ||
        !callbacks->GetModuleFunctionTable(MODULE_CORE2, &core2, &core2_size))
        return 0;
    if (path && *path)
        log_fd = open(path, O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0644);
    set(core, core_size, CORE_RangePushEx, (NvtxFunctionPointer)range_push_ex);
    set(core, core_size, CORE_RangePushA, (NvtxFunctionPointer)range_push_a);
    set(core, core_size, CORE_RangePop, (NvtxFunctionPointer)range_pop);
    set(core2, core2_size, CORE2_RangePushEx, (NvtxFunctionPointer)domain_push_ex);
    set(core2, core2_size, CORE2_RangePop, (NvtxFunctionPointer)domain_pop);
    set(core2, core2_size, CORE2_RegisterStringA, (NvtxFunctionPointer)register_string);
    set(core2, core2_size, CORE2_CreateA, (NvtxFunctionPointer)create_domain);
    return 1; /* success: NVTX routes the calls above here, and makes the rest no-ops */
}
