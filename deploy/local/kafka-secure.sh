# The secured local broker of `deploy/local/kafka.sh --secure` (sourced by kafka.sh, not run).
# shellcheck shell=bash
#
#   clients   SASL_SSL on 127.0.0.1:9192: SCRAM-SHA-512 over TLS; the certificate names localhost and 127.0.0.1, so
#             clients keep hostname verification on (librdkafka's default ssl.endpoint.identification.algorithm=https)
#   broker    CONTROLLER (9193) and INTERNAL (9194, inter-broker) listeners take TLS client certificates only: the
#             broker's own certificate (principal User:CN=kafka-broker) is a super user there. SCRAM cannot serve the
#             controller listener in KRaft (the credentials live in the metadata log the controller serves).
#   authz     StandardAuthorizer, allow.everyone.if.no.acl.found=false: a principal may do only what an ACL grants.
#   users     admin (super user, for set-up), pipeline and compaction (no ACLs until granted: `pipeline acls`),
#             created with the storage format (KRaft stores SCRAM credentials in its metadata log).
#
# Everything is generated on the first start into .run/kafka-secure/security/: a throw-away CA (ca.pem), the
# broker's key and certificate in a PKCS12 keystore, and credentials.env (mode 600) with every password. Passwords
# come from KAFKA_SECURE_<USER>_PASSWORD / KAFKA_SECURE_KEYSTORE_PASSWORD when set on that first start (tests use
# sentinel values), else from openssl's random generator. `stop --wipe` forgets all of it.

SECURE_USERS=(admin pipeline compaction)
SECURE_INTERNAL_PORT=9194

secure_prepare() {
  require_command openssl "Install OpenSSL (Debian: apt-get install openssl); it makes the local CA and certificates."
  mkdir -p "$SECURE_DIR"
  chmod 700 "$SECURE_DIR"
  if [[ ! -s "$SECURE_DIR/credentials.env" ]]; then
    [[ -f "$(node_dir 1)/data/meta.properties" ]] \
      && die "$DIR has data but no credentials: run '$0 --secure stop --wipe' and start again"
    secure_write_credentials
  fi
  [[ -s "$SECURE_DIR/broker.p12" ]] || secure_make_certificates
}

secure_password() {  # $1: the variable name; its value if set, else a random one
  local value="${!1:-}"
  [[ -n "$value" ]] && { printf '%s' "$value"; return; }
  openssl rand -hex 16
}

secure_write_credentials() {
  local user var file="$SECURE_DIR/credentials.env"
  (
    umask 077
    {
      echo "# Written by deploy/local/kafka.sh --secure on its first start. Secrets: never commit or log this file."
      echo "KAFKA_SECURE_BOOTSTRAP=127.0.0.1:$(client_port 1)"
      echo "KAFKA_SECURE_CA=$SECURE_DIR/ca.pem"
      echo "KAFKA_SECURE_KEYSTORE_PASSWORD=$(secure_password KAFKA_SECURE_KEYSTORE_PASSWORD)"
      for user in "${SECURE_USERS[@]}"; do
        var="KAFKA_SECURE_${user^^}_PASSWORD"
        echo "$var=$(secure_password "$var")"
      done
    } >"$file"
  )
}

secure_credential() {  # $1: a name in credentials.env
  sed -n "s/^$1=//p" "$SECURE_DIR/credentials.env"
}

secure_make_certificates() {
  local d="$SECURE_DIR" log="$SECURE_DIR/openssl.log"
  info "making a local CA and the broker's certificate in $d"
  (
    set -e
    umask 077
    openssl req -x509 -newkey rsa:2048 -nodes -days 825 -subj "/CN=eos-pipeline local CA" \
      -keyout "$d/ca.key" -out "$d/ca.pem" \
      -addext "basicConstraints=critical,CA:TRUE" -addext "keyUsage=critical,keyCertSign,cRLSign"
    openssl req -newkey rsa:2048 -nodes -subj "/CN=kafka-broker" -keyout "$d/broker.key" -out "$d/broker.csr"
    printf '%s\n' "subjectAltName=DNS:localhost,IP:127.0.0.1" "extendedKeyUsage=serverAuth,clientAuth" \
      "keyUsage=critical,digitalSignature,keyEncipherment" >"$d/broker.ext"
    openssl x509 -req -in "$d/broker.csr" -CA "$d/ca.pem" -CAkey "$d/ca.key" -CAcreateserial -days 825 \
      -extfile "$d/broker.ext" -out "$d/broker.pem"
    # The password goes through the environment, never the command line (visible in ps).
    KEYSTORE_PASSWORD="$(secure_credential KAFKA_SECURE_KEYSTORE_PASSWORD)" \
      openssl pkcs12 -export -in "$d/broker.pem" -inkey "$d/broker.key" -certfile "$d/ca.pem" -name kafka-broker \
      -out "$d/broker.p12" -passout env:KEYSTORE_PASSWORD
    chmod 644 "$d/ca.pem"
    rm -f "$d/broker.csr" "$d/broker.ext" "$d/broker.key" "$d/ca.srl"
  ) >"$log" 2>&1 || { cat "$log" >&2; die "making the certificates failed (log: $log)"; }
}

secure_listener_config() {  # $1: client port, $2: controller port
  local keystore_password
  keystore_password="$(secure_credential KAFKA_SECURE_KEYSTORE_PASSWORD)"
  cat <<EOF
listeners=SASL_SSL://127.0.0.1:$1,CONTROLLER://127.0.0.1:$2,INTERNAL://127.0.0.1:$SECURE_INTERNAL_PORT
advertised.listeners=SASL_SSL://127.0.0.1:$1,INTERNAL://127.0.0.1:$SECURE_INTERNAL_PORT
controller.listener.names=CONTROLLER
inter.broker.listener.name=INTERNAL
listener.security.protocol.map=SASL_SSL:SASL_SSL,CONTROLLER:SSL,INTERNAL:SSL
sasl.enabled.mechanisms=SCRAM-SHA-512
listener.name.sasl_ssl.scram-sha-512.sasl.jaas.config=org.apache.kafka.common.security.scram.ScramLoginModule required;
ssl.keystore.type=PKCS12
ssl.keystore.location=$SECURE_DIR/broker.p12
ssl.keystore.password=$keystore_password
ssl.key.password=$keystore_password
ssl.truststore.type=PEM
ssl.truststore.location=$SECURE_DIR/ca.pem
listener.name.controller.ssl.client.auth=required
listener.name.internal.ssl.client.auth=required
authorizer.class.name=org.apache.kafka.metadata.authorizer.StandardAuthorizer
allow.everyone.if.no.acl.found=false
super.users=User:admin;User:CN=kafka-broker
EOF
}

secure_scram_arguments() {  # one argument a line, for the storage format
  local user
  for user in "${SECURE_USERS[@]}"; do
    echo "--add-scram"
    echo "SCRAM-SHA-512=[name=$user,password=$(secure_credential "KAFKA_SECURE_${user^^}_PASSWORD")]"
  done
}
