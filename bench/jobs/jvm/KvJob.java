/* A JVM job over a skewed working set, for bench/jobs.py: --size bytes of
 * 4 KiB records (each a long[512] on the heap), read and updated by keys
 * drawn with YCSB's scrambled zipfian (as bench/jobs/keys.py), 95% reads.
 *
 *   record[0] = its id, record[1] = updates made to it,
 *   record[j] = base(id, j) + record[1] for j >= 2 (an update adds 1 to all)
 *
 * A read sums the whole record and checks every word of it. Phases: build
 * (untimed), warm-up, timed, verify (untimed: the updates counted in the
 * records equal those made, and every record is whole). Prints one JSON
 * line as the Python jobs do. */
import java.util.Arrays;
import java.util.Random;

public class KvJob {
    static final int WORDS = 512;
    static final long ITEMS = 10_000_000_000L;
    static final double THETA = 0.99, ZETAN = 26.46902820178302;
    static final int SAMPLES_MAX = 4_000_000;

    static long base(long id, int j) {
        long x = id * 0x9E3779B97F4A7C15L + j;
        x ^= x >>> 29;
        return x * 0xBF58476D1CE4E5B9L;
    }

    static long fnv(long v) {
        long h = 0xCBF29CE484222325L;
        for (int i = 0; i < 8; i++) {
            h ^= v & 0xFF;
            v >>>= 8;
            h *= 1099511628211L;
        }
        return Math.abs(h);
    }

    static final double ALPHA = 1.0 / (1.0 - THETA);
    static final double ETA = (1 - Math.pow(2.0 / ITEMS, 1 - THETA)) / (1 - (1 + Math.pow(0.5, THETA)) / ZETAN);
    static final double HALF_POW = 1.0 + Math.pow(0.5, THETA);

    static int key(Random rng, int records) {
        double u = rng.nextDouble(), uz = u * ZETAN;
        long rank = uz < 1.0 ? 0 : uz < HALF_POW ? 1 : (long) (ITEMS * Math.pow(ETA * u - ETA + 1, ALPHA));
        return (int) Long.remainderUnsigned(fnv(rank), records);
    }

    static String check(long[] r, int id) {
        if (r[0] != id) return "record " + id + " holds id " + r[0];
        for (int j = 2; j < WORDS; j++)
            if (r[j] != base(id, j) + r[1]) return "record " + id + " word " + j + " is wrong";
        return null;
    }

    static String arg(String[] a, String name, String dflt) {
        for (int i = 0; i + 1 < a.length; i++) if (a[i].equals(name)) return a[i + 1];
        return dflt;
    }

    public static void main(String[] a) {
        long size = Long.parseLong(arg(a, "--size", "536870912"));
        double seconds = Double.parseDouble(arg(a, "--seconds", "20"));
        double warm = Double.parseDouble(arg(a, "--warm-seconds", "20"));
        Random rng = new Random(Long.parseLong(arg(a, "--seed", "1")));
        int records = (int) (size / (WORDS * 8));
        long t0 = System.nanoTime();
        long[][] recs = new long[records][];
        for (int id = 0; id < records; id++) {
            long[] r = new long[WORDS];
            r[0] = id;
            for (int j = 2; j < WORDS; j++) r[j] = base(id, j);
            recs[id] = r;
        }
        double buildS = (System.nanoTime() - t0) / 1e9;
        long[] updates = {0};
        String[] error = {null};
        run(recs, rng, warm, null, updates, error);
        long[] lat = new long[SAMPLES_MAX];
        long t1 = System.nanoTime();
        long ops = run(recs, rng, seconds, lat, updates, error);
        double took = (System.nanoTime() - t1) / 1e9;
        long counted = 0;
        for (int id = 0; id < records && error[0] == null; id++) {
            counted += recs[id][1];
            String e = check(recs[id], id);
            if (e != null) error[0] = e;
        }
        if (error[0] == null && counted != updates[0])
            error[0] = "records count " + counted + " updates, " + updates[0] + " were made";
        int n = (int) Math.min(ops, SAMPLES_MAX);
        long[] s = Arrays.copyOf(lat, n);
        Arrays.sort(s);
        double p50 = n > 0 ? s[n / 2] / 1e3 : 0, p99 = n > 0 ? s[(int) (n * 0.99)] / 1e3 : 0;
        double p999 = n > 0 ? s[(int) (n * 0.999)] / 1e3 : 0;
        System.out.printf("{\"ops\":%d,\"seconds\":%.3f,\"ops_per_s\":%.1f,\"p50_us\":%.1f,\"p99_us\":%.1f," +
                "\"p999_us\":%.1f,\"unit\":\"record\",\"rows\":%d,\"build_s\":%.2f,\"verified\":%b,\"errors\":[%s]}%n",
                ops, took, ops / took, p50, p99, p999, records, buildS, error[0] == null,
                error[0] == null ? "" : "\"" + error[0] + "\"");
        System.exit(error[0] == null ? 0 : 1);
    }

    /** Reads (95%) and updates for `seconds`; each op's latency into `lat` if given. */
    static long run(long[][] recs, Random rng, double seconds, long[] lat, long[] updates, String[] error) {
        long end = System.nanoTime() + (long) (seconds * 1e9), ops = 0, sink = 0;
        while (error[0] == null) {
            if ((ops & 63) == 0 && System.nanoTime() >= end) break;
            long t = lat != null ? System.nanoTime() : 0;
            int id = key(rng, recs.length);
            long[] r = recs[id];
            if (rng.nextInt(100) < 95) {
                String e = check(r, id);
                if (e != null) error[0] = e;
                for (long v : r) sink += v;
            } else {
                r[1]++;
                for (int j = 2; j < WORDS; j++) r[j]++;
                updates[0]++;
            }
            if (lat != null && ops < lat.length) lat[(int) ops] = System.nanoTime() - t;
            ops++;
        }
        if (sink == 42) System.err.print("");
        return ops;
    }
}
