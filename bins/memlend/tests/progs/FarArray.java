/* A JVM job whose heap is several times memlend's budget: one array of
 * MIB MiB of longs, rewritten in three passes and summed, the sum printed.
 * The JVM reserves its heap PROT_NONE and commits it with MAP_FIXED, which
 * is how far memory reaches it (crates/preload/src/reserve.rs). */
public class FarArray {
    public static void main(String[] args) {
        int mib = Integer.parseInt(args[0]);
        long[] a = new long[mib * 131072];
        for (int pass = 0; pass < 3; pass++) {
            for (int i = 0; i < a.length; i++) {
                a[i] = a[i] * 31 + (i ^ pass);
            }
        }
        long sum = 0;
        for (long v : a) {
            sum += v;
        }
        System.out.println("sum " + sum);
    }
}
