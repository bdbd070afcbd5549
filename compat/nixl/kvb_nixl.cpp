/* kvbridge as a NIXL backend plug-in (libplugin_KVBRIDGE.so): NIXL's
 * engine class translated call by call onto kvbridge's public engine API
 * (include/kvbridge/engine.h). A translation layer with no decision of its
 * own: bounds, settle, lane choice and the order of a transfer's
 * notification after its bytes are the engine's. docs/nixl.md says what
 * maps onto what.
 *
 * Self-contained: NIXL dlopens plug-ins RTLD_LOCAL and this one links
 * neither libnixl_common.so nor libnixl_build.so, so it uses nothing of
 * NIXL but its headers' inline code and class layouts: no NIXL logging
 * macros (abseil), no nixlBackendPluginCreator, no descriptor list copied
 * or built. Errors go to kvbridge's log. No exception crosses an entry
 * point NIXL calls. */
#include "backend/backend_engine.h"
#include "backend/backend_plugin.h"

#include <kvbridge/common.h>
#include <kvbridge/engine.h>

#include <cstdarg>
#include <cstdio>
#include <cstdlib>
#include <map>
#include <memory>
#include <mutex>
#include <new>
#include <string>
#include <vector>

namespace
{

constexpr const char *kName = "KVBRIDGE";
constexpr const char *kVersion = "0.1.0";
constexpr const char *kMdPrefix = "kvb1:"; /* getPublicData's blob: "kvb1:<addr>:<len>" */
/* How long a release that was refused once waits for the end of the
 * transfer it gave up (kvb_xfer_expire ends it within about two of the
 * engine's peer time-outs, 2 s by default), with slack. */
constexpr double kReleaseSettleS = 5.0;

void log_error(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
void log_error(const char *fmt, ...)
{
    char buf[512];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(buf, sizeof(buf), fmt, ap);
    va_end(ap);
    fprintf(stderr, "kvbridge nixl: %s\n", buf);
}

/* kvbridge's status as NIXL's (docs/nixl.md, "Statuses"). */
nixl_status_t to_nixl(kvb_status_t st)
{
    switch (st) {
    case KVB_OK:
        return NIXL_SUCCESS;
    case KVB_ERR_INPROGRESS:
        return NIXL_IN_PROG;
    case KVB_ERR_INVALID:
    case KVB_ERR_BOUNDS:
    case KVB_ERR_OVERLAP:
        return NIXL_ERR_INVALID_PARAM;
    case KVB_ERR_NOT_FOUND:
        return NIXL_ERR_NOT_FOUND;
    case KVB_ERR_PEER:
        return NIXL_ERR_REMOTE_DISCONNECT;
    case KVB_ERR_CANCELED:
        return NIXL_ERR_CANCELED;
    case KVB_ERR_UNSUPPORTED:
        return NIXL_ERR_NOT_SUPPORTED;
    case KVB_ERR_AUTH:
    case KVB_ERR_FENCED:
        return NIXL_ERR_NOT_ALLOWED;
    default:
        return NIXL_ERR_BACKEND;
    }
}

/* A registration here (local), or a peer's region (remote: its agent's
 * session id; also what loadLocalMD gives, naming our own session). */
struct kvbMD : public nixlBackendMD {
    bool remote;
    uintptr_t addr;
    size_t len;
    nixl_mem_t mem;
    std::string sid; /* remote: the peer engine's session id */
    int refs = 1;    /* local: registerMem calls of this exact range */
    kvbMD(bool is_remote, uintptr_t a, size_t l, nixl_mem_t m, std::string s)
        : nixlBackendMD(!is_remote), remote(is_remote), addr(a), len(l), mem(m), sid(std::move(s))
    {
    }
};

/* A prepared transfer: its blocks in kvbridge's form, built once; each
 * post starts a fresh kvb_xfer_h (a repost never reuses a finished one). */
struct kvbReqH : public nixlBackendReqH {
    bool read = false;
    std::string sid;
    std::vector<kvb_block_t> blocks;
    kvb_xfer_h x = nullptr;
    bool release_refused = false; /* releaseReqH found it running once */
    ~kvbReqH() override
    {
        kvb_xfer_free(x);
    }
};

class kvbNixlEngine : public nixlBackendEngine
{
  public:
    explicit kvbNixlEngine(const nixlBackendInitParams *init) : nixlBackendEngine(init)
    {
        kvb_engine_params_t p{};
        std::string host = param("host", "127.0.0.1"), tr = param("transport", "auto");
        p.field_mask = KVB_ENGINE_PARAM_HOST | KVB_ENGINE_PARAM_NAME;
        p.host = host.c_str();
        p.name = localAgent.c_str();
        std::string port = param("port", "0");
        char *end = nullptr;
        unsigned long pv = strtoul(port.c_str(), &end, 10);
        if (port.empty() || *end != '\0' || pv > 65535 ||
            (tr != "auto" && tr != "tcp" && tr != "shm")) {
            log_error("agent %s: backend parameters port '%s' (0..65535) or transport '%s' "
                      "(auto, tcp, shm) invalid",
                      localAgent.c_str(), port.c_str(), tr.c_str());
            initErr = true;
            return;
        }
        if (pv != 0) {
            p.field_mask |= KVB_ENGINE_PARAM_PORT;
            p.port = (uint16_t)pv;
        }
        if (tr != "auto") { /* "auto": the engine's default (KVBRIDGE_TRANSPORT) */
            p.field_mask |= KVB_ENGINE_PARAM_TRANSPORT;
            p.transport = tr == "tcp" ? KVB_TRANSPORT_TCP : KVB_TRANSPORT_SHM;
        }
        kvb_status_t st = kvb_engine_create(&p, &eng_);
        if (st != KVB_OK) {
            log_error("engine for agent %s not created: %s", localAgent.c_str(),
                      kvb_status_string(st));
            eng_ = nullptr;
            initErr = true;
        }
    }

    ~kvbNixlEngine() override
    {
        kvb_engine_destroy(eng_); /* ends transfers still running CANCELED */
        for (auto &kv : regs_)
            delete kv.second;
    }

    bool supportsRemote() const override
    {
        return true;
    }
    bool supportsLocal() const override
    {
        return true;
    }
    bool supportsNotif() const override
    {
        return true;
    }
    nixl_mem_list_t getSupportedMems() const override
    {
        return {DRAM_SEG, VRAM_SEG};
    }

    nixl_status_t registerMem(const nixlBlobDesc &mem, const nixl_mem_t &nixl_mem,
                              nixlBackendMD *&out) override
    {
        try {
            if (nixl_mem != DRAM_SEG && nixl_mem != VRAM_SEG)
                return NIXL_ERR_NOT_SUPPORTED;
            std::lock_guard<std::mutex> g(mu_);
            auto it = regs_.find(mem.addr);
            if (it != regs_.end() && it->second->len == mem.len && it->second->mem == nixl_mem) {
                it->second->refs++; /* the same range again (two NIXL registrations) */
                out = it->second;
                return NIXL_SUCCESS;
            }
            kvb_mem_region_ex_t r{};
            r.field_mask = 0;
            r.addr = reinterpret_cast<void *>(mem.addr);
            r.length = mem.len;
            r.mem_type = nixl_mem == VRAM_SEG ? KVB_MEM_CUDA : KVB_MEM_HOST;
            if (nixl_mem == VRAM_SEG) {
                r.field_mask |= KVB_MEM_REGION_FIELD_DEVICE;
                r.device = (int)mem.devId;
            }
            kvb_status_t st = kvb_engine_register_ex(eng_, &r, 1, sizeof(r));
            if (st != KVB_OK) {
                log_error("registerMem %#lx+%zu: %s", (unsigned long)mem.addr, mem.len,
                          kvb_engine_last_error(eng_));
                return to_nixl(st);
            }
            auto *md = new kvbMD(false, mem.addr, mem.len, nixl_mem, "");
            regs_[mem.addr] = md;
            out = md;
            return NIXL_SUCCESS;
        } catch (const std::exception &e) {
            return fail("registerMem", e);
        }
    }

    nixl_status_t deregisterMem(nixlBackendMD *meta) override
    {
        auto *md = static_cast<kvbMD *>(meta);
        std::lock_guard<std::mutex> g(mu_);
        if (md == nullptr || md->remote)
            return NIXL_ERR_INVALID_PARAM;
        if (--md->refs > 0)
            return NIXL_SUCCESS;
        kvb_status_t st = kvb_engine_unregister(eng_, reinterpret_cast<void *>(md->addr));
        if (st != KVB_OK) { /* e.g. a peer's write still being placed: stays registered */
            md->refs++;
            log_error("deregisterMem %#lx: %s", (unsigned long)md->addr,
                      kvb_engine_last_error(eng_));
            return to_nixl(st);
        }
        regs_.erase(md->addr);
        delete md;
        return NIXL_SUCCESS;
    }

    /* Sessions open on first use (kvbridge's handshake), so there is
     * nothing to do ahead; disconnect closes the session. */
    nixl_status_t connect(const std::string &agent) override
    {
        return sidFor(agent).empty() ? NIXL_ERR_NOT_FOUND : NIXL_SUCCESS;
    }

    nixl_status_t disconnect(const std::string &agent) override
    {
        std::string sid = sidFor(agent);
        if (sid.empty())
            return NIXL_ERR_NOT_FOUND;
        if (agent != localAgent)
            kvb_engine_close_session(eng_, sid.c_str()); /* NOT_FOUND: never used */
        return NIXL_SUCCESS;
    }

    nixl_status_t getConnInfo(std::string &str) const override
    {
        str = kvb_engine_session_id(eng_);
        return NIXL_SUCCESS;
    }

    nixl_status_t loadRemoteConnInfo(const std::string &agent, const std::string &info) override
    {
        try {
            /* "host:port" / "[v6]:port": the engine checks it when it
             * connects; here only that it is one printable line */
            if (info.empty() || info.size() > 300 ||
                info.find_first_of(std::string("\0\n\r ", 4)) != std::string::npos)
                return NIXL_ERR_INVALID_PARAM;
            std::lock_guard<std::mutex> g(mu_);
            peers_[agent] = info;
            return NIXL_SUCCESS;
        } catch (const std::exception &e) {
            return fail("loadRemoteConnInfo", e);
        }
    }

    nixl_status_t getPublicData(const nixlBackendMD *meta, std::string &str) const override
    {
        auto *md = static_cast<const kvbMD *>(meta);
        if (md == nullptr || md->remote)
            return NIXL_ERR_INVALID_PARAM;
        str = kMdPrefix + std::to_string(md->addr) + ":" + std::to_string(md->len);
        return NIXL_SUCCESS;
    }

    nixl_status_t loadRemoteMD(const nixlBlobDesc &in, const nixl_mem_t &mem,
                               const std::string &agent, nixlBackendMD *&out) override
    {
        try {
            std::string sid = sidFor(agent);
            if (sid.empty())
                return NIXL_ERR_NOT_FOUND;
            /* The peer's blob must name this descriptor's range; the engine
             * checks every transfer against the peer's own table anyway. */
            std::string want = kMdPrefix + std::to_string(in.addr) + ":" + std::to_string(in.len);
            if (in.metaInfo != want)
                return NIXL_ERR_INVALID_PARAM;
            out = new kvbMD(true, in.addr, in.len, mem, sid);
            return NIXL_SUCCESS;
        } catch (const std::exception &e) {
            return fail("loadRemoteMD", e);
        }
    }

    nixl_status_t loadLocalMD(nixlBackendMD *in, nixlBackendMD *&out) override
    {
        try {
            auto *md = static_cast<kvbMD *>(in);
            if (md == nullptr || md->remote)
                return NIXL_ERR_INVALID_PARAM;
            out = new kvbMD(true, md->addr, md->len, md->mem, kvb_engine_session_id(eng_));
            return NIXL_SUCCESS;
        } catch (const std::exception &e) {
            return fail("loadLocalMD", e);
        }
    }

    nixl_status_t unloadMD(nixlBackendMD *in) override
    {
        auto *md = static_cast<kvbMD *>(in);
        if (md != nullptr && md->remote)
            delete md;
        return NIXL_SUCCESS;
    }

    nixl_status_t prepXfer(const nixl_xfer_op_t &op, const nixl_meta_dlist_t &local,
                           const nixl_meta_dlist_t &remote, const std::string &agent,
                           nixlBackendReqH *&handle,
                           const nixl_opt_b_args_t * = nullptr) const override
    {
        try {
            int n = local.descCount();
            if (n != remote.descCount() || (op != NIXL_READ && op != NIXL_WRITE))
                return NIXL_ERR_INVALID_PARAM;
            auto h = std::make_unique<kvbReqH>();
            h->read = op == NIXL_READ;
            h->sid = sidFor(agent);
            if (h->sid.empty())
                return NIXL_ERR_NOT_FOUND;
            h->blocks.resize((size_t)n);
            for (int i = 0; i < n; i++) {
                const nixlMetaDesc &l = local[i], &r = remote[i];
                if (l.len != r.len)
                    return NIXL_ERR_INVALID_PARAM;
                /* kvbridge names a block after its bytes: a read's src is
                 * the peer's address (engine.h, "One-sided reads") */
                h->blocks[(size_t)i] = h->read ? kvb_block_t{r.addr, l.addr, l.len}
                                               : kvb_block_t{l.addr, r.addr, l.len};
            }
            handle = h.release();
            return NIXL_SUCCESS;
        } catch (const std::exception &e) {
            return fail("prepXfer", e);
        }
    }

    nixl_status_t postXfer(const nixl_xfer_op_t &, const nixl_meta_dlist_t &,
                           const nixl_meta_dlist_t &, const std::string &, nixlBackendReqH *&handle,
                           const nixl_opt_b_args_t *opt = nullptr) const override
    {
        auto *h = static_cast<kvbReqH *>(handle);
        if (h == nullptr)
            return NIXL_ERR_INVALID_PARAM;
        if (h->x != nullptr && kvb_xfer_test(h->x) == KVB_ERR_INPROGRESS)
            return NIXL_ERR_REPOST_ACTIVE;
        kvb_xfer_free(h->x); /* the previous post, final */
        h->x = nullptr;
        h->release_refused = false;
        kvb_write_params_t wp{};
        if (opt != nullptr && opt->hasNotif) {
            wp.field_mask = KVB_WRITE_PARAM_NOTIF;
            wp.notif = opt->notifMsg.data();
            wp.notif_len = opt->notifMsg.size();
        }
        kvb_status_t st = h->read
                              ? kvb_engine_read_async_ex(eng_, h->sid.c_str(), h->blocks.data(),
                                                         h->blocks.size(), &wp, &h->x)
                              : kvb_engine_write_async_ex(eng_, h->sid.c_str(), h->blocks.data(),
                                                          h->blocks.size(), &wp, &h->x);
        if (st != KVB_OK) {
            h->x = nullptr;
            log_error("postXfer %s of %zu descriptors to %s: %s", h->read ? "READ" : "WRITE",
                      h->blocks.size(), h->sid.c_str(), kvb_engine_last_error(eng_));
            return to_nixl(st);
        }
        return check(h);
    }

    nixl_status_t checkXfer(nixlBackendReqH *handle) const override
    {
        auto *h = static_cast<kvbReqH *>(handle);
        return h == nullptr || h->x == nullptr ? NIXL_ERR_NOT_POSTED : check(h);
    }

    /* A running transfer is given up (kvb_xfer_expire: cancelled, its
     * connection failed should the peer not settle within the engine's peer
     * time-out); if it has not ended yet the release is refused (NIXL then
     * reports the request failed and keeps it), so nothing lands after NIXL
     * calls it released. Called again (a retry, or NIXL's request
     * destructor) it waits for the end, which the engine bounds. */
    nixl_status_t releaseReqH(nixlBackendReqH *handle) const override
    {
        auto *h = static_cast<kvbReqH *>(handle);
        if (h == nullptr)
            return NIXL_SUCCESS;
        if (h->x != nullptr && kvb_xfer_test(h->x) == KVB_ERR_INPROGRESS) {
            kvb_xfer_expire(h->x);
            bool ended = kvb_xfer_wait(h->x, h->release_refused ? kReleaseSettleS : 0.001) !=
                         KVB_ERR_TIMEOUT;
            if (!ended && !h->release_refused) {
                h->release_refused = true;
                return NIXL_ERR_REPOST_ACTIVE;
            }
            if (!ended || !kvb_xfer_drained(h->x))
                log_error("release: a %s to %s did not settle: bytes may still land",
                          h->read ? "READ" : "WRITE", h->sid.c_str());
        }
        delete h;
        return NIXL_SUCCESS;
    }

    nixl_status_t getNotifs(notif_list_t &list) override
    {
        try {
            kvb_notif_t nt[64];
            size_t n = 0;
            do {
                if (kvb_engine_get_notifs(eng_, nt, 64, &n) != KVB_OK)
                    return NIXL_ERR_BACKEND;
                for (size_t i = 0; i < n; i++)
                    list.emplace_back(
                        std::string(nt[i].sender),
                        std::string(reinterpret_cast<const char *>(nt[i].msg), nt[i].len));
                kvb_notifs_free(nt, n);
            } while (n == 64);
            return NIXL_SUCCESS;
        } catch (const std::exception &e) {
            return fail("getNotifs", e);
        }
    }

    nixl_status_t genNotif(const std::string &agent, const std::string &msg) const override
    {
        std::string sid = sidFor(agent);
        if (sid.empty())
            return NIXL_ERR_NOT_FOUND;
        kvb_status_t st = kvb_engine_notify(eng_, sid.c_str(), msg.data(), msg.size(), 0);
        if (st != KVB_OK)
            log_error("genNotif to %s: %s", agent.c_str(), kvb_engine_last_error(eng_));
        return to_nixl(st);
    }

  private:
    kvb_engine_h eng_ = nullptr;
    mutable std::mutex mu_;
    std::map<uintptr_t, kvbMD *> regs_;        /* local registrations by start */
    std::map<std::string, std::string> peers_; /* agent name -> session id */

    std::string param(const char *key, const char *def) const
    {
        std::string v;
        return getInitParam(key, v) == NIXL_SUCCESS && !v.empty() ? v : std::string(def);
    }

    /* The session id of agent's engine (ours for our own name), or "". */
    std::string sidFor(const std::string &agent) const
    {
        if (agent == localAgent)
            return kvb_engine_session_id(eng_);
        std::lock_guard<std::mutex> g(mu_);
        auto it = peers_.find(agent);
        return it == peers_.end() ? std::string() : it->second;
    }

    nixl_status_t check(kvbReqH *h) const
    {
        kvb_status_t st = kvb_xfer_test(h->x);
        if (st != KVB_OK && st != KVB_ERR_INPROGRESS && !h->release_refused) {
            log_error("%s to %s failed: %s%s", h->read ? "READ" : "WRITE", h->sid.c_str(),
                      kvb_xfer_error(h->x),
                      kvb_xfer_drained(h->x) ? ""
                                             : " (not drained: bytes the peer already received "
                                               "may still be placed if it resumes)");
        }
        return to_nixl(st);
    }

    static nixl_status_t fail(const char *what, const std::exception &e)
    {
        log_error("%s: %s", what, e.what());
        return dynamic_cast<const std::bad_alloc *>(&e) != nullptr ? NIXL_ERR_BACKEND
                                                                   : NIXL_ERR_UNKNOWN;
    }
};

nixlBackendEngine *create_engine(const nixlBackendInitParams *init)
{
    try {
        return new kvbNixlEngine(init);
    } catch (const std::exception &e) {
        log_error("create_engine: %s", e.what());
        return nullptr;
    }
}

void destroy_engine(nixlBackendEngine *eng)
{
    delete eng;
}

const char *plugin_name()
{
    return kName;
}

const char *plugin_version()
{
    return kVersion;
}

nixl_b_params_t backend_options()
{
    return {{"host", "127.0.0.1"}, {"port", "0"}, {"transport", "auto"}};
}

nixl_mem_list_t backend_mems()
{
    return {DRAM_SEG, VRAM_SEG};
}

/* Filled by hand: nixlBackendPluginCreator would pull abseil symbols. */
nixlBackendPlugin plugin = {NIXL_PLUGIN_API_VERSION, create_engine,   destroy_engine, plugin_name,
                            plugin_version,          backend_options, backend_mems};

} // namespace

extern "C" NIXL_PLUGIN_EXPORT nixlBackendPlugin *nixl_plugin_init()
{
    return &plugin;
}

extern "C" NIXL_PLUGIN_EXPORT void nixl_plugin_fini() {}
