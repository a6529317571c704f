/* url.c -- worker URLs, the discovery URL, KV-event endpoints and listen addresses (url.h).
 *
 * Worker URLs go through libcurl's URL parser and are rebuilt from its parts as
 * "scheme://host[:port]" (the normal form that names a worker); the discovery URL is a worker URL
 * that must name a port; endpoints and host:port pairs are split by hand and their addresses read
 * with inet_pton.
 */
#include "proto/url.h"

#include "base/kvr.h"

#include <arpa/inet.h>
#include <curl/curl.h>
#include <net/if.h>
#include <netinet/in.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

/* One URL part, or NULL when absent; the caller frees it with curl_free(). */
static char *url_part(CURLU *u, CURLUPart what) {
  char *v = NULL;
  if (curl_url_get(u, what, &v, 0) != CURLUE_OK)
    return NULL;
  return v;
}

int kvr_url_worker(const char *url, char *out, size_t outlen, char *err, size_t errlen) {
  for (const char *p = url; *p; p++) {
    unsigned char c = (unsigned char)*p;
    if (c <= ' ' || c >= 0x7f) {
      snprintf(err, errlen, "worker URL '%s' contains an invalid character", url);
      return KVR_EINVAL;
    }
  }
  if (strncasecmp(url, "http://", 7) != 0 && strncasecmp(url, "https://", 8) != 0) {
    snprintf(err, errlen, "worker URL '%s' must start with http:// or https://", url);
    return KVR_EINVAL;
  }
  CURLU *u = curl_url();
  if (u == NULL)
    kvr_oom("curl_url", 0);
  int rc = KVR_EINVAL;
  char *scheme = NULL, *host = NULL, *port = NULL, *user = NULL, *password = NULL, *path = NULL,
       *query = NULL, *fragment = NULL, *zone = NULL;
  CURLUcode uc = curl_url_set(u, CURLUPART_URL, url, 0);
  if (uc == CURLUE_BAD_PORT_NUMBER) {
    snprintf(err, errlen, "worker URL '%s': the port must be a number in 1..65535", url);
    goto out;
  }
  if (uc != CURLUE_OK) {
    snprintf(err, errlen, "worker URL '%s': %s", url, curl_url_strerror(uc));
    goto out;
  }
  const char *auth = strstr(url, "://") + 3;
  size_t alen = strcspn(auth, "/");
  if (alen == 0) { /* "http:///x": libcurl would take x as the host */
    snprintf(err, errlen, "worker URL '%s' has no host", url);
    goto out;
  }
  if (alen > 0 && auth[alen - 1] == ':') {
    snprintf(err, errlen, "worker URL '%s': the port must be a number in 1..65535", url);
    goto out;
  }
  scheme = url_part(u, CURLUPART_SCHEME);
  host = url_part(u, CURLUPART_HOST);
  port = url_part(u, CURLUPART_PORT); /* only when the URL names one */
  user = url_part(u, CURLUPART_USER);
  password = url_part(u, CURLUPART_PASSWORD);
  path = url_part(u, CURLUPART_PATH);
  query = url_part(u, CURLUPART_QUERY);
  fragment = url_part(u, CURLUPART_FRAGMENT);
  if (scheme == NULL || (strcmp(scheme, "http") != 0 && strcmp(scheme, "https") != 0)) {
    snprintf(err, errlen, "worker URL '%s' must start with http:// or https://", url);
    goto out;
  }
  if (host == NULL || host[0] == '\0' || strcmp(host, "[]") == 0) {
    snprintf(err, errlen, "worker URL '%s' has no host", url);
    goto out;
  }
  if (host[strlen(host) - 1] ==
      '.') { /* "127.0.0.1." would be a second worker beside "127.0.0.1" */
    snprintf(err, errlen, "worker URL '%s': the host ends in a dot; write it without", url);
    goto out;
  }
  zone = url_part(u, CURLUPART_ZONEID); /* "[fe80::1%25eth0]": kept, it names the interface */
  if (user != NULL || password != NULL || strchr(url, '@') != NULL) {
    snprintf(err, errlen, "worker URL '%s' must not contain user info (USER@)", url);
    goto out;
  }
  if (port != NULL) {
    char *end;
    long pn = strtol(port, &end, 10);
    if (*port == '\0' || *end != '\0' || pn < 1 || pn > 65535) {
      snprintf(err, errlen, "worker URL '%s': the port must be a number in 1..65535", url);
      goto out;
    }
  }
  if (query != NULL || fragment != NULL || strchr(url, '?') != NULL || strchr(url, '#') != NULL) {
    snprintf(err, errlen, "worker URL '%s' must have no query or fragment", url);
    goto out;
  }
  if (path != NULL && path[strspn(path, "/")] != '\0') {
    snprintf(err, errlen, "worker URL '%s' must be %s://HOST[:PORT] with no path", url, scheme);
    goto out;
  }
  int n =
      zone ? snprintf(out, outlen, "%s://%.*s%%25%s]%s%s", scheme, (int)strlen(host) - 1, host,
                      zone, port ? ":" : "", port ? port : "")
           : snprintf(out, outlen, "%s://%s%s%s", scheme, host, port ? ":" : "", port ? port : "");
  if (n < 0 || (size_t)n >= outlen) {
    snprintf(err, errlen, "worker URL '%s' is too long", url);
    goto out;
  }
  rc = 0;
out:
  curl_free(scheme);
  curl_free(host);
  curl_free(port);
  curl_free(user);
  curl_free(password);
  curl_free(path);
  curl_free(query);
  curl_free(fragment);
  curl_free(zone);
  curl_url_cleanup(u);
  return rc;
}

int kvr_url_discovery(const char *url, kvr_url_target_t *t, char *err, size_t errlen) {
  char norm[512];
  if (kvr_url_worker(url, norm, sizeof norm, err, errlen) != 0) {
    char why[256];
    if (strncmp(err, "worker URL ", 11) == 0) { /* the same checks, under this URL's name */
      snprintf(why, sizeof why, "%s", err + 11);
      snprintf(err, errlen, "discovery URL %s", why);
    }
    return KVR_EINVAL;
  }
  /* norm is "scheme://host[:port]", the host of an IPv6 address in brackets */
  const char *sep = strstr(norm, "://");
  const char *host = sep + 3;
  const char *close = host[0] == '[' ? strchr(host, ']') : NULL;
  const char *colon = strrchr(close ? close : host, ':');
  if (colon == NULL) {
    snprintf(err, errlen,
             "discovery URL '%s' needs a port (http://NAME:PORT, the port every worker listens "
             "on)",
             url);
    return KVR_EINVAL;
  }
  size_t slen = (size_t)(sep - norm);
  const char *hb = close ? host + 1 : host, *he = close ? close : colon;
  if (slen >= sizeof t->scheme || (size_t)(he - hb) >= sizeof t->host || he == hb) {
    snprintf(err, errlen, "discovery URL '%s' has a host too long or empty", url);
    return KVR_EINVAL;
  }
  memcpy(t->scheme, norm, slen);
  t->scheme[slen] = '\0';
  memcpy(t->host, hb, (size_t)(he - hb));
  t->host[he - hb] = '\0';
  t->port = atoi(colon + 1); /* 1..65535: checked by kvr_url_worker() */
  return 0;
}

int kvr_url_kv_endpoint(const char *ep, char *err, size_t errlen) {
  bool tcp = strncmp(ep, "tcp://", 6) == 0, ipc = strncmp(ep, "ipc://", 6) == 0;
  const char *rest = ep + 6;
  const char *colon = tcp ? strrchr(rest, ':') : NULL;
  char *end = NULL;
  long port = colon ? strtol(colon + 1, &end, 10) : 0;
  if (ipc ? rest[0] == '\0'
          : !tcp || colon == NULL || colon == rest || *end != '\0' || port < 1 || port > 65535 ||
                strchr(rest, '*') != NULL) {
    snprintf(err, errlen,
             "KV-event endpoint '%.200s': want tcp://HOST:PORT (the engine's address, connected "
             "to) or ipc://PATH",
             ep);
    return KVR_EINVAL;
  }
  return 0;
}

int kvr_url_kv_endpoint_rank(const char *ep, uint32_t rank, char *out, size_t outlen, char *err,
                             size_t errlen) {
  int n;
  if (rank == 0) {
    n = snprintf(out, outlen, "%s", ep);
  } else if (strncmp(ep, "tcp://", 6) == 0) {
    const char *colon = strrchr(ep + 6, ':');
    long port = colon ? strtol(colon + 1, NULL, 10) : 0;
    if (colon == NULL || port + (long)rank > 65535) {
      snprintf(err, errlen,
               "KV-event endpoint '%.200s': rank %u would publish on port %ld (> 65535)", ep, rank,
               port + (long)rank);
      return KVR_EINVAL;
    }
    n = snprintf(out, outlen, "%.*s:%ld", (int)(colon - ep), ep, port + (long)rank);
  } else {
    n = snprintf(out, outlen, "%s_dp%u", ep, rank);
  }
  if (n < 0 || (size_t)n >= outlen) {
    snprintf(err, errlen, "KV-event endpoint '%.200s': too long", ep);
    return KVR_EINVAL;
  }
  return 0;
}

/* "a.b.c.d" and a port into *sa; KVR_EINVAL when the text is not a dotted IPv4 address. */
static int ip4_addr(const char *host, int port, struct sockaddr_in *sa) {
  sa->sin_family = AF_INET;
  sa->sin_port = htons((uint16_t)port);
  return inet_pton(AF_INET, host, &sa->sin_addr) == 1 ? 0 : KVR_EINVAL;
}

/* An IPv6 address, with an optional "%zone" (an interface name or number), and a port into *sa. */
static int ip6_addr(const char *host, int port, struct sockaddr_in6 *sa) {
  char addr[INET6_ADDRSTRLEN + 1];
  const char *zone = strchr(host, '%');
  size_t alen = zone ? (size_t)(zone - host) : strlen(host);
  if (alen >= sizeof addr)
    return KVR_EINVAL;
  memcpy(addr, host, alen);
  addr[alen] = '\0';
  sa->sin6_family = AF_INET6;
  sa->sin6_port = htons((uint16_t)port);
  if (inet_pton(AF_INET6, addr, &sa->sin6_addr) != 1)
    return KVR_EINVAL;
  if (zone) {
    char *end;
    unsigned long n = strtoul(zone + 1, &end, 10);
    sa->sin6_scope_id = zone[1] != '\0' && *end == '\0' ? (uint32_t)n : if_nametoindex(zone + 1);
    if (sa->sin6_scope_id == 0)
      return KVR_EINVAL;
  }
  return 0;
}

int kvr_url_hostport(const char *hostport, struct sockaddr_storage *out) {
  if (hostport == NULL)
    return KVR_EINVAL;
  char host[128];
  const char *colon;
  if (hostport[0] == '[') {
    const char *end = strchr(hostport, ']');
    if (end == NULL || end[1] != ':' || (size_t)(end - hostport - 1) >= sizeof host)
      return KVR_EINVAL;
    memcpy(host, hostport + 1, (size_t)(end - hostport - 1));
    host[end - hostport - 1] = '\0';
    colon = end + 1;
  } else {
    colon = strrchr(hostport, ':');
    if (colon == NULL || (size_t)(colon - hostport) >= sizeof host)
      return KVR_EINVAL;
    memcpy(host, hostport, (size_t)(colon - hostport));
    host[colon - hostport] = '\0';
  }
  char *endp;
  long port = strtol(colon + 1, &endp, 10);
  if (colon[1] == '\0' || *endp != '\0' || port < 0 || port > 65535)
    return KVR_EINVAL;
  if (strcmp(host, "localhost") == 0 || host[0] == '\0')
    strcpy(host, "127.0.0.1");
  memset(out, 0, sizeof *out);
  return strchr(host, ':') ? ip6_addr(host, (int)port, (struct sockaddr_in6 *)out)
                           : ip4_addr(host, (int)port, (struct sockaddr_in *)out);
}
