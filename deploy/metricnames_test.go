package deploy

import (
	"encoding/json"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"sort"
	"strings"
	"testing"

	dto "github.com/prometheus/client_model/go"
	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"
)

// promqlWords are the PromQL words that are not metric names: aggregation
// operators, binary operators and modifiers. A function name is known by
// the "(" that follows it.
var promqlWords = map[string]bool{
	"sum": true, "min": true, "max": true, "avg": true, "group": true, "stddev": true, "stdvar": true,
	"count": true, "count_values": true, "bottomk": true, "topk": true, "quantile": true,
	"limitk": true, "limit_ratio": true,
	"by": true, "without": true, "on": true, "ignoring": true, "group_left": true, "group_right": true,
	"bool": true, "and": true, "or": true, "unless": true, "atan2": true, "offset": true,
	"inf": true, "nan": true, "start": true, "end": true,
}

// labelListWords are followed by a parenthesised list of label names.
var labelListWords = map[string]bool{
	"by": true, "without": true, "on": true, "ignoring": true, "group_left": true, "group_right": true,
}

// promqlMetricNames returns the metric names expr selects, in order of
// first use. It reads PromQL as a lexer would: strings, label matchers
// ({...}), ranges ([...]), numbers and durations, Grafana's $variables and
// label lists after by, without, on, ignoring, group_left and group_right
// are skipped; a word followed by "(" is a function. Its syntax is
// promtool's to check; a selector by {__name__=...} is refused, since its
// name cannot be read this way.
func promqlMetricNames(expr string) ([]string, error) {
	if strings.Contains(expr, "__name__") {
		return nil, fmt.Errorf("%q selects by __name__: name the metric instead", expr)
	}
	var names []string
	i := 0
	for i < len(expr) {
		c := expr[i]
		switch {
		case c == '"' || c == '\'' || c == '`':
			i = skipString(expr, i)
		case c == '{':
			i = skipPast(expr, i, '{', '}')
		case c == '[':
			i = skipPast(expr, i, '[', ']')
		case c == '$':
			i++
			if i < len(expr) && expr[i] == '{' {
				i = skipPast(expr, i, '{', '}')
			}
			for i < len(expr) && isWordByte(expr[i]) {
				i++
			}
		case c >= '0' && c <= '9' || c == '.':
			for i < len(expr) && (isWordByte(expr[i]) || expr[i] == '.') {
				i++
			}
		case isWordStart(c):
			j := i
			for j < len(expr) && (isWordByte(expr[j]) || expr[j] == ':') {
				j++
			}
			word := expr[i:j]
			lower := strings.ToLower(word) // keywords are case-insensitive
			k := j
			for k < len(expr) && (expr[k] == ' ' || expr[k] == '\t' || expr[k] == '\n') {
				k++
			}
			next := byte(0)
			if k < len(expr) {
				next = expr[k]
			}
			switch {
			case labelListWords[lower] && next == '(':
				j = skipPast(expr, k, '(', ')')
			case promqlWords[lower] || next == '(':
			default:
				if !slices.Contains(names, word) {
					names = append(names, word)
				}
			}
			i = j
		default:
			i++
		}
	}
	return names, nil
}

func isWordStart(c byte) bool {
	return c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c == '_' || c == ':'
}

func isWordByte(c byte) bool { return isWordStart(c) || c >= '0' && c <= '9' }

// skipString returns the index after the string starting at i.
func skipString(s string, i int) int {
	q := s[i]
	for i++; i < len(s); i++ {
		switch {
		case s[i] == '\\' && q != '`':
			i++
		case s[i] == q:
			return i + 1
		}
	}
	return i
}

// skipPast returns the index after the close that matches the open at i,
// skipping strings.
func skipPast(s string, i int, open, close byte) int {
	depth := 0
	for i < len(s) {
		switch s[i] {
		case '"', '\'', '`':
			i = skipString(s, i)
			continue
		case open:
			depth++
		case close:
			depth--
			if depth == 0 {
				return i + 1
			}
		}
		i++
	}
	return i
}

// labelValues matches Grafana's label_values(QUERY, LABEL) variable query.
var labelValues = regexp.MustCompile(`^\s*label_values\((.*),\s*[A-Za-z_][A-Za-z0-9_]*\s*\)\s*$`)

// metricUses maps each metric name the monitoring files use to where.
type metricUses map[string][]string

// add records the metric names of expr, used at where.
func (u metricUses) add(where, expr string) error {
	names, err := promqlMetricNames(expr)
	if err != nil {
		return fmt.Errorf("%s: %w", where, err)
	}
	for _, n := range names {
		u[n] = append(u[n], where)
	}
	return nil
}

// ruleMetrics returns the metrics the rule file uses, and the names its
// recording rules define.
func ruleMetrics(rf ruleFile, file string) (metricUses, map[string]bool, error) {
	uses, recorded := metricUses{}, map[string]bool{}
	for _, g := range rf.Groups {
		for _, r := range g.Rules {
			where := fmt.Sprintf("%s: alert %s", file, r.Alert)
			if r.Record != "" {
				where = fmt.Sprintf("%s: record %s", file, r.Record)
				recorded[r.Record] = true
			}
			if err := uses.add(where, r.Expr); err != nil {
				return nil, nil, err
			}
		}
	}
	return uses, recorded, nil
}

// grafanaDashboard is the part of a Grafana dashboard the tests read:
// panels (rows hold more when collapsed), their queries, and the
// templating variables' queries.
type grafanaDashboard struct {
	Title      string         `json:"title"`
	UID        string         `json:"uid"`
	Panels     []grafanaPanel `json:"panels"`
	Templating struct {
		List []struct {
			Name  string          `json:"name"`
			Type  string          `json:"type"`
			Query json.RawMessage `json:"query"`
		} `json:"list"`
	} `json:"templating"`
}

type grafanaPanel struct {
	ID         int                `json:"id"`
	Type       string             `json:"type"`
	Title      string             `json:"title"`
	Datasource *grafanaDatasource `json:"datasource"`
	GridPos    struct {
		H, W, X, Y int
	} `json:"gridPos"`
	Targets []struct {
		Expr       string             `json:"expr"`
		RefID      string             `json:"refId"`
		Datasource *grafanaDatasource `json:"datasource"`
	} `json:"targets"`
	Panels []grafanaPanel `json:"panels"`
}

type grafanaDatasource struct {
	Type string `json:"type"`
	UID  string `json:"uid"`
}

func readDashboard(r io.Reader) (grafanaDashboard, error) {
	var d grafanaDashboard
	dec := json.NewDecoder(r)
	if err := dec.Decode(&d); err != nil {
		return d, fmt.Errorf("not a dashboard: %w", err)
	}
	return d, nil
}

// allPanels returns the dashboard's panels, those inside collapsed rows
// included.
func (d grafanaDashboard) allPanels() []grafanaPanel {
	var out []grafanaPanel
	var walk func([]grafanaPanel)
	walk = func(ps []grafanaPanel) {
		for _, p := range ps {
			out = append(out, p)
			walk(p.Panels)
		}
	}
	walk(d.Panels)
	return out
}

// dashboardMetrics returns the metrics the dashboard's panels and
// variables use.
func dashboardMetrics(d grafanaDashboard, file string) (metricUses, error) {
	uses := metricUses{}
	for _, p := range d.allPanels() {
		for _, tg := range p.Targets {
			if err := uses.add(fmt.Sprintf("%s: panel %q, query %s", file, p.Title, tg.RefID), tg.Expr); err != nil {
				return nil, err
			}
		}
	}
	for _, v := range d.Templating.List {
		if v.Type != "query" {
			continue
		}
		// The query is a string, or an object with the string in "query".
		var q struct {
			Query string `json:"query"`
		}
		if err := json.Unmarshal(v.Query, &q.Query); err != nil {
			if err := json.Unmarshal(v.Query, &q); err != nil {
				return nil, fmt.Errorf("%s: variable %s: query %s: %w", file, v.Name, v.Query, err)
			}
		}
		expr := q.Query
		if m := labelValues.FindStringSubmatch(expr); m != nil {
			expr = m[1]
		}
		if err := uses.add(fmt.Sprintf("%s: variable %s", file, v.Name), expr); err != nil {
			return nil, err
		}
	}
	return uses, nil
}

// exported maps each series name an instance's /metrics holds to its
// metric family: a histogram's _bucket, _sum and _count series (a
// summary's _sum and _count) to the histogram (summary), anything else to
// itself.
type exported map[string]string

// parseExposition reads a /metrics page in Prometheus's text format.
func parseExposition(r io.Reader) (exported, error) {
	p := expfmt.NewTextParser(model.LegacyValidation)
	fams, err := p.TextToMetricFamilies(r)
	if err != nil {
		return nil, err
	}
	out := exported{}
	for name, f := range fams {
		switch f.GetType() {
		case dto.MetricType_HISTOGRAM, dto.MetricType_GAUGE_HISTOGRAM:
			for _, s := range []string{"_bucket", "_sum", "_count"} {
				out[name+s] = name
			}
		case dto.MetricType_SUMMARY:
			out[name], out[name+"_sum"], out[name+"_count"] = name, name, name
		default:
			out[name] = name
		}
	}
	return out, nil
}

// merge adds what another instance exports.
func (e exported) merge(o exported) {
	for k, v := range o {
		e[k] = v
	}
}

// missingMetrics returns, sorted, a line for each metric used that is
// neither recorded by the rules nor exported, saying where it is used.
func missingMetrics(uses metricUses, recorded map[string]bool, ex exported) []string {
	var out []string
	for name, where := range uses {
		if recorded[name] {
			continue
		}
		if _, ok := ex[name]; ok {
			continue
		}
		out = append(out, fmt.Sprintf("%s (used by %s)", name, strings.Join(where, "; ")))
	}
	sort.Strings(out)
	return out
}

// monitoringMetrics returns every metric the dashboard and the rules of
// deploy/monitoring/ use, and the names the rules record.
func monitoringMetrics(t testing.TB) (metricUses, map[string]bool) {
	t.Helper()
	uses, recorded, err := ruleMetrics(loadRules(t), rulesFile)
	if err != nil {
		t.Fatal(err)
	}
	d := loadDashboard(t)
	du, err := dashboardMetrics(d, dashboardFile)
	if err != nil {
		t.Fatal(err)
	}
	for name, where := range du {
		uses[name] = append(uses[name], where...)
	}
	return uses, recorded
}

func TestPromQLMetricNames(t *testing.T) {
	for _, tc := range []struct {
		expr string
		want []string
	}{
		{`coredns_pgcluster_registry_up == 0`, []string{"coredns_pgcluster_registry_up"}},
		{`sum by (job, instance) (rate(coredns_dns_requests_total{job=~"$job",zone="a{b}"}[$__rate_interval]))`, []string{"coredns_dns_requests_total"}},
		{`histogram_quantile(0.99, sum by (job, le) (rate(x_seconds_bucket[5m]))) > 1`, []string{"x_seconds_bucket"}},
		{`a == 1 unless on (job, zone) (min by (job, zone) (b{mode="local"}) == 1)`, []string{"a", "b"}},
		{`time() - max by (instance) (load_ts{job=~"$job"}) offset 5m`, []string{"load_ts"}},
		{`count(count by (zone, cluster) (p != 1)) or vector(0)`, []string{"p"}},
		{`sum without (le) (h_count) / ignoring (x) group_left (y) other:recorded:rate5m`, []string{"h_count", "other:recorded:rate5m"}},
		{`topk(5, label_replace(m, "dst", "$1", "src", "(.*)"))`, []string{"m"}},
		{`max(a) BY (job) + max(a) by(job)`, []string{"a"}},
		{`1e3 * 2.5 + 0x1f`, nil},
	} {
		got, err := promqlMetricNames(tc.expr)
		if err != nil {
			t.Errorf("%s: %v", tc.expr, err)
			continue
		}
		if !slices.Equal(got, tc.want) {
			t.Errorf("%s: metric names %q, want %q", tc.expr, got, tc.want)
		}
	}
	if _, err := promqlMetricNames(`{__name__="x"}`); err == nil {
		t.Error(`{__name__="x"}: no error, want one: its name cannot be checked`)
	}
}

// TestMissingMetricsFound shows the check of TestMonitoringMetricsExported
// at work on a fabricated panel: a metric that no instance exports is
// reported with the panel that names it, and a histogram's series map to
// the histogram.
func TestMissingMetricsFound(t *testing.T) {
	ex, err := parseExposition(strings.NewReader(`# HELP coredns_pgcluster_probe_duration_seconds Probe time.
# TYPE coredns_pgcluster_probe_duration_seconds histogram
coredns_pgcluster_probe_duration_seconds_bucket{zone="z.",check="tcp",le="0.1"} 1
coredns_pgcluster_probe_duration_seconds_bucket{zone="z.",check="tcp",le="+Inf"} 1
coredns_pgcluster_probe_duration_seconds_sum{zone="z.",check="tcp"} 0.01
coredns_pgcluster_probe_duration_seconds_count{zone="z.",check="tcp"} 1
# HELP coredns_pgcluster_registry_up Registry.
# TYPE coredns_pgcluster_registry_up gauge
coredns_pgcluster_registry_up{zone="z."} 1
`))
	if err != nil {
		t.Fatal(err)
	}
	if ex["coredns_pgcluster_probe_duration_seconds_count"] != "coredns_pgcluster_probe_duration_seconds" {
		t.Errorf("_count series maps to %q, want the histogram", ex["coredns_pgcluster_probe_duration_seconds_count"])
	}
	dash := `{"title": "t", "panels": [
  {"id": 1, "type": "row", "title": "r", "panels": [
    {"id": 2, "type": "timeseries", "title": "Probes", "targets": [
      {"refId": "A", "expr": "histogram_quantile(0.9, sum by (le) (rate(coredns_pgcluster_probe_duration_seconds_bucket[5m])))"},
      {"refId": "B", "expr": "rate(coredns_pgcluster_probes_fabricated_total[5m]) + coredns_pgcluster_registry_up"},
      {"refId": "C", "expr": "coredns_pgcluster_probe_duration_seconds"}]}]}],
 "templating": {"list": [{"name": "job", "type": "query", "query": {"query": "label_values(coredns_pgcluster_registry_up, job)"}}]}}`
	d, err := readDashboard(strings.NewReader(dash))
	if err != nil {
		t.Fatal(err)
	}
	uses, err := dashboardMetrics(d, "fabricated.json")
	if err != nil {
		t.Fatal(err)
	}
	got := missingMetrics(uses, nil, ex)
	want := []string{
		`coredns_pgcluster_probe_duration_seconds (used by fabricated.json: panel "Probes", query C)`,
		`coredns_pgcluster_probes_fabricated_total (used by fabricated.json: panel "Probes", query B)`,
	}
	if !slices.Equal(got, want) {
		t.Errorf("missing metrics:\n%s\nwant:\n%s", strings.Join(got, "\n"), strings.Join(want, "\n"))
	}
	// A recording rule's name is not exported by an instance, and is not missing.
	if got := missingMetrics(metricUses{"pgcluster:x:rate5m": {"here"}}, map[string]bool{"pgcluster:x:rate5m": true}, ex); len(got) != 0 {
		t.Errorf("a recorded name is reported missing: %q", got)
	}
}

// TestDashboard checks the dashboard's structure: every panel has a unique
// id and a place, every query a Prometheus data source through the
// ${datasource} variable, and every panel of the rows queries something.
func TestDashboard(t *testing.T) {
	d := loadDashboard(t)
	if d.Title == "" || d.UID == "" {
		t.Errorf("%s: title %q, uid %q: both are needed to import it", dashboardFile, d.Title, d.UID)
	}
	ids := map[int]bool{}
	queries := 0
	for _, p := range d.allPanels() {
		if ids[p.ID] {
			t.Errorf("panel %q: id %d given twice", p.Title, p.ID)
		}
		ids[p.ID] = true
		if p.GridPos.W <= 0 || p.GridPos.H <= 0 || p.GridPos.X+p.GridPos.W > 24 {
			t.Errorf("panel %q: gridPos %+v does not fit the 24 columns", p.Title, p.GridPos)
		}
		if p.Type == "row" {
			continue
		}
		if len(p.Targets) == 0 {
			t.Errorf("panel %q queries nothing", p.Title)
		}
		for _, tg := range p.Targets {
			queries++
			ds := tg.Datasource
			if ds == nil {
				ds = p.Datasource
			}
			if ds == nil || ds.Type != "prometheus" || ds.UID != "${datasource}" {
				t.Errorf("panel %q query %s: data source %+v, want prometheus ${datasource}", p.Title, tg.RefID, ds)
			}
			if strings.TrimSpace(tg.Expr) == "" {
				t.Errorf("panel %q query %s has no expr", p.Title, tg.RefID)
			}
		}
	}
	if queries < 20 {
		t.Errorf("%s has %d queries; the fleet's dashboard has more", dashboardFile, queries)
	}
	// What the dashboard must show at the least: answers and requests,
	// nodes, probes and their time, leases, propagation delay, reload time
	// and the snapshot serial.
	uses, err := dashboardMetrics(d, dashboardFile)
	if err != nil {
		t.Fatal(err)
	}
	for _, m := range []string{
		"coredns_dns_responses_total", "coredns_dns_requests_total", "coredns_pgcluster_nodes",
		"coredns_pgcluster_probes_total", "pgcluster:probe_duration_seconds:p99_5m", "coredns_pgcluster_redis_leases",
		"pgcluster:redis_propagation_seconds:p99_5m", "pgcluster:registry_reload_duration_seconds:p99_5m",
		"coredns_pgcluster_snapshot_serial",
	} {
		if _, ok := uses[m]; !ok {
			t.Errorf("%s does not plot %s", dashboardFile, m)
		}
	}
}

// loadDashboard reads deploy/monitoring's dashboard.
func loadDashboard(t testing.TB) grafanaDashboard {
	t.Helper()
	f, err := os.Open(filepath.Join(monitoringDir, dashboardFile))
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	d, err := readDashboard(f)
	if err != nil {
		t.Fatalf("%s: %v", dashboardFile, err)
	}
	return d
}
