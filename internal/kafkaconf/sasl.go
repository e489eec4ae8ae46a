package kafkaconf

import (
	"context"
	"errors"
	"fmt"
	"net/url"
	"os"
	"strconv"
	"strings"

	"github.com/twmb/franz-go/pkg/sasl"
	"github.com/twmb/franz-go/pkg/sasl/oauth"
	"github.com/twmb/franz-go/pkg/sasl/plain"
	"github.com/twmb/franz-go/pkg/sasl/scram"
)

// SASL is one SASL login, whichever keys it came from.
type SASL struct {
	// Mechanism: PLAIN, SCRAM-SHA-256, SCRAM-SHA-512 or OAUTHBEARER (case
	// insensitive).
	Mechanism string
	// Username and Password for PLAIN and SCRAM.
	Username, Password string
	// TokenAuth: SCRAM with a delegation token (KIP-48; Java's
	// ScramLoginModule option tokenauth="true").
	TokenAuth bool
	// Token is a static OAUTHBEARER token (a JWT as the broker expects it).
	Token string
	// TokenFile is a file holding the OAUTHBEARER token, read again at
	// every authentication (so a rotated token is picked up by the next
	// connection); surrounding blanks are trimmed.
	TokenFile string
}

// Login module classes of sasl.jaas.config that Ferry maps.
const (
	plainModule       = "org.apache.kafka.common.security.plain.PlainLoginModule"
	scramModule       = "org.apache.kafka.common.security.scram.ScramLoginModule"
	oauthBearerModule = "org.apache.kafka.common.security.oauthbearer.OAuthBearerLoginModule"
)

// NewMechanism returns the franz-go mechanism of a.
//
// Errors (*Error): an unknown or unsupported mechanism (GSSAPI), PLAIN or
// SCRAM without a user name, OAUTHBEARER without exactly one of Token and
// TokenFile, a TokenFile that cannot be read now.
func NewMechanism(a SASL) (sasl.Mechanism, error) {
	mech := strings.ToUpper(strings.TrimSpace(a.Mechanism))
	switch mech {
	case MechPlain, MechScramSHA256, MechScramSHA512:
		if a.Username == "" {
			return nil, errorf(KeySASLMechanism, "%s needs a user name", mech)
		}
		if a.Token != "" || a.TokenFile != "" {
			return nil, errorf(KeySASLMechanism, "%s takes a user name and password, not an OAUTHBEARER token", mech)
		}
	case MechOAuthBearer:
		if (a.Token == "") == (a.TokenFile == "") {
			return nil, errorf(KeySASLMechanism, "OAUTHBEARER needs exactly one token source: a static token or a token file")
		}
		if a.TokenFile != "" {
			if _, err := readToken(a.TokenFile); err != nil {
				return nil, &Error{Key: KeySASLMechanism, Err: err}
			}
		}
	case "GSSAPI":
		return nil, &Error{Key: KeySASLMechanism, Err: fmt.Errorf("GSSAPI (Kerberos) is %w: use PLAIN, SCRAM-SHA-256, SCRAM-SHA-512 or OAUTHBEARER", ErrUnsupported)}
	case "":
		return nil, errorf(KeySASLMechanism, "required with a SASL security.protocol (Kafka's default, GSSAPI, is not supported): want PLAIN, SCRAM-SHA-256, SCRAM-SHA-512 or OAUTHBEARER")
	default:
		return nil, errorf(KeySASLMechanism, "%q: want PLAIN, SCRAM-SHA-256, SCRAM-SHA-512 or OAUTHBEARER", a.Mechanism)
	}
	switch mech {
	case MechPlain:
		return plain.Auth{User: a.Username, Pass: a.Password}.AsMechanism(), nil
	case MechScramSHA256:
		return scram.Auth{User: a.Username, Pass: a.Password, IsToken: a.TokenAuth}.AsSha256Mechanism(), nil
	case MechScramSHA512:
		return scram.Auth{User: a.Username, Pass: a.Password, IsToken: a.TokenAuth}.AsSha512Mechanism(), nil
	}
	if a.Token != "" {
		return oauth.Auth{Token: a.Token}.AsMechanism(), nil
	}
	file := a.TokenFile
	return oauth.Oauth(func(context.Context) (oauth.Auth, error) {
		tok, err := readToken(file)
		return oauth.Auth{Token: tok}, err
	}), nil
}

// maxTokenBytes bounds a token file (JWTs are a few KiB).
const maxTokenBytes = 1 << 20

func readToken(path string) (string, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return "", fmt.Errorf("OAUTHBEARER token file: %w", err)
	}
	if len(b) > maxTokenBytes {
		return "", fmt.Errorf("OAUTHBEARER token file %s: %d bytes, more than %d", path, len(b), maxTokenBytes)
	}
	tok := strings.TrimSpace(string(b))
	if tok == "" {
		return "", fmt.Errorf("OAUTHBEARER token file %s is empty", path)
	}
	return tok, nil
}

// parseSASL gathers the login from sasl.mechanism, sasl.jaas.config or
// sasl.username/sasl.password, and the token endpoint.
func parseSASL(p props) (SASL, error) {
	a := SASL{Mechanism: strings.ToUpper(p.get(KeySASLMechanism))}
	jaas, user := p.get(KeySASLJAASConfig), p.get(KeySASLUsername)
	if jaas != "" && (user != "" || p.get(KeySASLPassword) != "") {
		return a, errorf(KeySASLJAASConfig, "set together with sasl.username/sasl.password: use one style (Java's sasl.jaas.config or librdkafka's sasl.username)")
	}
	if jaas != "" {
		module, opts, err := parseJAAS(jaas)
		if err != nil {
			return a, &Error{Key: KeySASLJAASConfig, Err: err}
		}
		if err := a.fromJAAS(module, opts); err != nil {
			return a, &Error{Key: KeySASLJAASConfig, Err: err}
		}
	} else {
		a.Username, a.Password = user, p.get(KeySASLPassword)
	}
	if cb := p.get(KeyLoginCallback); cb != "" && !strings.HasSuffix(cb, ".OAuthBearerLoginCallbackHandler") {
		return a, &Error{Key: KeyLoginCallback, Err: fmt.Errorf("%q: a Java class is %w (only Kafka's OAuthBearerLoginCallbackHandler with a file: %s is understood)", cb, ErrUnsupported, KeyOAuthTokenEndpoint)}
	}
	if ep := p.get(KeyOAuthTokenEndpoint); ep != "" {
		if a.Mechanism != MechOAuthBearer {
			return a, errorf(KeyOAuthTokenEndpoint, "set, but sasl.mechanism is %q, not OAUTHBEARER", a.Mechanism)
		}
		if a.Token != "" || a.TokenFile != "" {
			return a, errorf(KeyOAuthTokenEndpoint, "set together with a token in sasl.jaas.config: use one")
		}
		u, err := url.Parse(ep)
		if err != nil || u.Scheme != "file" {
			return a, &Error{Key: KeyOAuthTokenEndpoint, Err: fmt.Errorf("%q: only a file: URL (a file holding the token) is supported; fetching tokens from an OAuth endpoint is %w", ep, ErrUnsupported)}
		}
		a.TokenFile = u.Path
		if a.TokenFile == "" {
			a.TokenFile = u.Opaque
		}
	}
	return a, nil
}

// fromJAAS applies one login module of sasl.jaas.config to a, checking that
// it matches sasl.mechanism.
func (a *SASL) fromJAAS(module string, opts map[string]string) error {
	known := map[string][]string{
		plainModule:       {"username", "password"},
		scramModule:       {"username", "password", "tokenauth"},
		oauthBearerModule: {"token", "tokenFile"},
	}
	want, ok := known[module]
	if !ok {
		return fmt.Errorf("login module %s is %w (want %s, %s or %s)", module, ErrUnsupported, plainModule, scramModule, oauthBearerModule)
	}
	for k := range opts {
		if !contains(want, k) {
			if module == oauthBearerModule && strings.HasPrefix(k, "unsecuredLogin") {
				return fmt.Errorf("option %s: unsecured OAUTHBEARER logins are %w; give the token with token=\"…\" or tokenFile=\"…\"", k, ErrUnsupported)
			}
			return fmt.Errorf("option %s of %s is not known (known: %s)", k, module, strings.Join(want, ", "))
		}
	}
	switch {
	case module == plainModule && a.Mechanism != MechPlain,
		module == scramModule && a.Mechanism != MechScramSHA256 && a.Mechanism != MechScramSHA512,
		module == oauthBearerModule && a.Mechanism != MechOAuthBearer:
		return fmt.Errorf("login module %s does not serve sasl.mechanism %q", module, a.Mechanism)
	}
	a.Username, a.Password = opts["username"], opts["password"]
	a.Token, a.TokenFile = opts["token"], opts["tokenFile"]
	if v, ok := opts["tokenauth"]; ok {
		b, err := strconv.ParseBool(v)
		if err != nil {
			return fmt.Errorf("option tokenauth %q: want true or false", v)
		}
		a.TokenAuth = b
	}
	return nil
}

func contains(list []string, s string) bool {
	for _, e := range list {
		if e == s {
			return true
		}
	}
	return false
}

// parseJAAS reads a sasl.jaas.config value as Kafka's JaasConfig does:
// exactly one "LoginModuleClass controlFlag (name=value)* ;", values
// unquoted words or double-quoted strings with backslash escapes.
func parseJAAS(s string) (module string, opts map[string]string, err error) {
	toks, err := jaasTokens(s)
	if err != nil {
		return "", nil, err
	}
	if len(toks) < 2 || toks[0].quoted || toks[0].text == ";" {
		return "", nil, errors.New(`want "LoginModuleClass required name=\"value\" …;"`)
	}
	module = toks[0].text
	switch toks[1].text {
	case "required", "requisite", "sufficient", "optional":
	default:
		return "", nil, fmt.Errorf("control flag %q after %s: want required", toks[1].text, module)
	}
	opts = map[string]string{}
	i := 2
	for ; i < len(toks) && toks[i].text != ";"; i += 3 {
		if toks[i].quoted || toks[i].text == "=" {
			// Not a name: perhaps a value (a secret) out of place; not shown.
			return "", nil, fmt.Errorf("option %d of %s: a value where an option name belongs: want name=\"value\"", (i-2)/3+1, module)
		}
		if i+2 >= len(toks) || toks[i+1].text != "=" || toks[i+2].text == ";" && !toks[i+2].quoted {
			if name := toks[i].text; jaasOptionNames[name] || i+1 < len(toks) && toks[i+1].text == "=" {
				return "", nil, fmt.Errorf("option %s of %s: want %s=\"value\"", name, module, name)
			}
			// A word without '=' after it may be the rest of an unquoted
			// value (password=two words): not shown.
			return "", nil, fmt.Errorf("option %d of %s: a word without '=' where an option name belongs: want name=\"value\" (quote values that hold blanks)", (i-2)/3+1, module)
		}
		opts[toks[i].text] = toks[i+2].text
	}
	if i >= len(toks) {
		return "", nil, errors.New("missing ';' at the end of the login module")
	}
	if i != len(toks)-1 {
		return "", nil, errors.New("more than one login module: a Kafka client takes exactly one")
	}
	return module, opts, nil
}

// jaasOptionNames are the option names of the login modules Ferry maps: a
// parse error may show these, never another word (it may be a secret).
var jaasOptionNames = map[string]bool{"username": true, "password": true, "tokenauth": true, "token": true, "tokenFile": true}

type jaasToken struct {
	text   string
	quoted bool
}

func jaasTokens(s string) ([]jaasToken, error) {
	var toks []jaasToken
	for i := 0; i < len(s); {
		c := s[i]
		switch {
		case c == ' ' || c == '\t' || c == '\n' || c == '\r':
			i++
		case c == '=' || c == ';':
			toks = append(toks, jaasToken{text: string(c)})
			i++
		case c == '"' || c == '\'':
			var b strings.Builder
			j := i + 1
			for ; j < len(s) && s[j] != c; j++ {
				if s[j] == '\\' && j+1 < len(s) {
					j++
				}
				b.WriteByte(s[j])
			}
			if j >= len(s) {
				return nil, errors.New("unterminated quoted value")
			}
			toks = append(toks, jaasToken{text: b.String(), quoted: true})
			i = j + 1
		default:
			j := i
			for j < len(s) && !strings.ContainsRune(" \t\n\r=;\"'", rune(s[j])) {
				j++
			}
			toks = append(toks, jaasToken{text: s[i:j]})
			i = j
		}
	}
	return toks, nil
}
